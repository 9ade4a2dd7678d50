//! Name and structure checks over every item, including layers no model instantiates (so
//! `mgnc check stdlib/nn.mgn` finds typos in unused code). Values and shapes are checked later,
//! during elaboration, where they are known.

use super::load::{Binding, ModId, Program};
use super::nearest;
use crate::elab::builtins;
use crate::source::STDLIB;
use mgn_syntax::ast::*;
use mgn_syntax::{Diagnostic, Span};

pub fn check(prog: &Program) -> Vec<Diagnostic> {
    let mut diags = Vec::new();
    for (i, m) in prog.modules.iter().enumerate() {
        for item in &m.ast.items {
            let mut c = Checker {
                prog,
                module: ModId(i),
                layer: None,
                fields_visible: 0,
                locals: Vec::new(),
                diags: &mut diags,
                model_top: false,
            };
            c.item(item);
        }
    }
    diags
}

struct Checker<'p, 'd> {
    prog: &'p Program,
    module: ModId,
    layer: Option<&'p LayerItem>,
    /// How many of the layer's fields are visible (all in `forward`, earlier ones in field initializers).
    fields_visible: usize,
    locals: Vec<Vec<String>>,
    diags: &'d mut Vec<Diagnostic>,
    /// True directly inside a model's forward block, where `output` and `loss` may appear.
    model_top: bool,
}

impl<'p> Checker<'p, '_> {
    fn item(&mut self, item: &'p Item) {
        match item {
            Item::Use(_) => {}
            Item::Const(c) => {
                if let Some(t) = &c.ty {
                    self.ty(t, false);
                }
                self.expr(&c.value)
            }
            Item::Fn(f) => {
                self.locals.push(Vec::new());
                self.params(&f.params);
                if let Some(r) = &f.ret {
                    self.ty(r, true);
                }
                self.block(&f.body, false);
                self.locals.pop();
            }
            Item::Layer(l) => self.layer(l),
        }
    }

    fn layer(&mut self, l: &'p LayerItem) {
        self.layer = Some(l);
        let is_model = l.kind == LayerKind::Model;
        self.duplicates(l);
        self.locals.push(Vec::new());
        self.params(&l.params);
        if !is_model {
            for i in &l.inputs {
                self.diags.push(
                    Diagnostic::error(
                        "E0107",
                        format!("layer `{}` declares an input", l.name.name),
                        i.span,
                        "only a `model` has inputs",
                    )
                    .with_help(format!(
                        "make it a parameter of the forward: `forward({}: ...)`",
                        i.name.name
                    )),
                );
            }
        }
        for (n, f) in l.fields.iter().enumerate() {
            self.fields_visible = n;
            if let Some(c) = &f.cond {
                self.expr(c);
            }
            match &f.init {
                FieldInit::Tensor { ty, init, .. } => {
                    self.tensor_type(ty, false);
                    if let Some(i) = init {
                        self.expr(i);
                    }
                }
                FieldInit::Repeat { count, index, body } => {
                    self.expr(count);
                    self.locals.push(index.iter().map(|i| i.name.clone()).collect());
                    self.expr(body);
                    self.locals.pop();
                }
                FieldInit::Expr(e) => self.expr(e),
            }
        }
        self.fields_visible = l.fields.len();
        // Input shapes may use fields (`input x: f32[B, self_dim]`): they are created after them.
        for i in &l.inputs {
            self.tensor_type(&i.ty, false);
        }
        // Inputs of a layer were reported above; binding them anyway avoids a second report at each use.
        for i in &l.inputs {
            self.bind(&i.name.name);
        }
        for (n, fwd) in l.forward.iter().enumerate() {
            if n > 0 {
                self.diags.push(
                    Diagnostic::error(
                        "E0106",
                        format!("`{}` has more than one `forward`", l.name.name),
                        fwd.span,
                        "second `forward`",
                    )
                    .with_label(l.forward[0].span, "first `forward` here"),
                );
                continue;
            }
            self.locals.push(Vec::new());
            if is_model && !fwd.params.is_empty() {
                self.diags.push(
                    Diagnostic::error(
                        "E0107",
                        "a model's `forward` takes no parameters",
                        fwd.params[0].span,
                        "parameter of a model forward",
                    )
                    .with_help(format!(
                        "declare it as a model input: `input {}: ...`",
                        fwd.params[0].name.name
                    )),
                );
            }
            self.params(&fwd.params);
            if let Some(r) = &fwd.ret {
                if is_model {
                    self.diags.push(
                        Diagnostic::error(
                            "E0107",
                            "a model's `forward` has no return type",
                            r.span(),
                            "not allowed on a model",
                        )
                        .with_help(
                            "name what the model produces with `output name = ...` statements",
                        ),
                    );
                } else {
                    self.ty(r, true);
                }
            }
            self.block(&fwd.body, is_model);
            if !is_model && fwd.body.tail.is_none() {
                let end = Span { start: fwd.body.span.end.saturating_sub(1), ..fwd.body.span };
                self.diags.push(
                    Diagnostic::error(
                        "E0107",
                        format!("the `forward` of `{}` returns nothing", l.name.name),
                        end,
                        "expected a final expression before `}`",
                    )
                    .with_help("end the block with the value the layer returns, e.g. `proj(y)`"),
                );
            }
            if is_model {
                let produces = fwd
                    .body
                    .stmts
                    .iter()
                    .any(|s| matches!(s, Stmt::Output { .. } | Stmt::Loss { .. }));
                if !produces {
                    self.diags.push(
                        Diagnostic::error("E0107", format!("model `{}` produces nothing", l.name.name), fwd.span, "no `output` or `loss` in this forward")
                            .with_help("add `output name = expr` for each result, and `loss expr` for training"),
                    );
                }
                if let Some(t) = &fwd.body.tail {
                    self.diags.push(
                        Diagnostic::error(
                            "E0107",
                            "a model's forward does not return a value",
                            t.span,
                            "unused final expression",
                        )
                        .with_help("name it: `output logits = ...`"),
                    );
                }
            }
            self.locals.pop();
        }
        if is_model && l.forward.is_empty() {
            self.diags.push(
                Diagnostic::error(
                    "E0107",
                    format!("model `{}` has no `forward`", l.name.name),
                    l.name.span,
                    "this model",
                )
                .with_help("add `forward { ... output name = ... }`"),
            );
        }
        self.locals.pop();
        self.layer = None;
    }

    fn duplicates(&mut self, l: &LayerItem) {
        let mut seen: Vec<&Ident> = Vec::new();
        let members = l
            .params
            .iter()
            .map(|p| (&p.name, "parameter"))
            .chain(l.inputs.iter().map(|i| (&i.name, "input")))
            .chain(l.fields.iter().map(|f| (&f.name, "field")));
        for (name, what) in members {
            if let Some(prev) = seen.iter().find(|p| p.name == name.name) {
                // A config parameter and a field may share a name: `self.name` is the field.
                let prev_is_param = l.params.iter().any(|p| std::ptr::eq(&p.name, *prev));
                if prev_is_param && what == "field" {
                    seen.push(name);
                    continue;
                }
                self.diags.push(
                    Diagnostic::error(
                        "E0106",
                        format!("`{}` is defined more than once in `{}`", name.name, l.name.name),
                        name.span,
                        format!("{what} defined again here"),
                    )
                    .with_label(prev.span, "first defined here"),
                );
            } else {
                seen.push(name);
            }
        }
    }

    fn params(&mut self, params: &'p [Param]) {
        for p in params {
            if let Some(d) = &p.default {
                self.expr(d);
            }
            self.ty(&p.ty, true);
            self.bind(&p.name.name);
        }
    }

    /// Walks a type; with `pattern`, bare unknown names in tensor dims bind new dim variables.
    fn ty(&mut self, t: &'p TypeExpr, pattern: bool) {
        match t {
            TypeExpr::Scalar(..) => {}
            TypeExpr::Tensor(tt) => self.tensor_type(tt, pattern),
            TypeExpr::Tuple(ts, _) => ts.iter().for_each(|t| self.ty(t, pattern)),
        }
    }

    fn tensor_type(&mut self, t: &'p TensorType, pattern: bool) {
        if pattern {
            for d in &t.dims {
                match d {
                    DimItem::Variadic(id) => self.bind(&id.name),
                    DimItem::Expr(Expr { kind: ExprKind::Name(n), .. }) if !self.resolves(n) => {
                        self.bind(n)
                    }
                    _ => {}
                }
            }
        }
        for d in &t.dims {
            if let DimItem::Expr(e) = d {
                self.expr(e);
            }
        }
    }

    fn bind(&mut self, name: &str) {
        self.locals.last_mut().expect("a scope is open").push(name.to_string());
    }

    fn block(&mut self, b: &'p Block, model_top: bool) {
        self.locals.push(Vec::new());
        for s in &b.stmts {
            match s {
                Stmt::Let { pat, ty, value, .. } => {
                    self.model_top_off(|c| c.expr(value));
                    if let Some(t) = ty {
                        self.ty(t, true);
                    }
                    self.pattern(pat);
                }
                Stmt::Output { name, value, span } => {
                    self.placement(model_top, "output", *span);
                    match value {
                        Some(v) => self.model_top_off(|c| c.expr(v)),
                        None => self.name(&name.name, name.span),
                    }
                }
                Stmt::Loss { value, span } => {
                    self.placement(model_top, "loss", *span);
                    self.model_top_off(|c| c.expr(value));
                }
            }
        }
        if let Some(t) = &b.tail {
            self.expr(t);
        }
        self.locals.pop();
    }

    fn model_top_off(&mut self, f: impl FnOnce(&mut Self)) {
        let saved = std::mem::replace(&mut self.model_top, false);
        f(self);
        self.model_top = saved;
    }

    fn placement(&mut self, model_top: bool, what: &str, span: Span) {
        if !model_top {
            let in_layer = self.layer.is_some_and(|l| l.kind == LayerKind::Layer);
            let mut d = Diagnostic::error(
                "E0107",
                format!("`{what}` is only allowed at the top of a model's forward"),
                span,
                format!("`{what}` here"),
            );
            if in_layer {
                d = d.with_help("a layer returns its result as the last expression of its forward; the model that uses it declares outputs and the loss");
            }
            self.diags.push(d);
        }
    }

    fn pattern(&mut self, p: &Pattern) {
        match p {
            Pattern::Name(id) => self.bind(&id.name),
            Pattern::Wildcard(_) => {}
            Pattern::Tuple(ps, _) => ps.iter().for_each(|p| self.pattern(p)),
        }
    }

    fn expr(&mut self, e: &'p Expr) {
        match &e.kind {
            ExprKind::Name(n) => self.name(n, e.span),
            ExprKind::SelfRef => {
                self.diags.push(Diagnostic::error(
                    "E0101",
                    "`self` must be followed by a field name",
                    e.span,
                    "expected `self.field`",
                ));
            }
            ExprKind::Field(base, field) => match &base.kind {
                ExprKind::SelfRef => self.self_field(field, base.span),
                ExprKind::Name(n) if self.module_binding(n).is_some() => {
                    let m = self.prog.module(self.module_binding(n).expect("checked"));
                    if m.item_index(&field.name).is_none() {
                        let mut d = Diagnostic::error(
                            "E0103",
                            format!("`{}` has no item named `{}`", m.name, field.name),
                            field.span,
                            "not found in this module",
                        );
                        if let Some(c) = nearest(&field.name, m.item_names()) {
                            d = d.with_help(format!("did you mean `{c}`?"));
                        }
                        self.diags.push(d);
                    }
                }
                _ => self.expr(base),
            },
            ExprKind::Unary(_, a) | ExprKind::Transpose(a) => self.expr(a),
            ExprKind::Binary(_, a, b) | ExprKind::Index(a, b) => {
                self.expr(a);
                self.expr(b);
            }
            ExprKind::Call { callee, args } => {
                self.expr(callee);
                args.iter().for_each(|a| self.expr(&a.value));
            }
            ExprKind::Tuple(xs) | ExprKind::List(xs) => xs.iter().for_each(|x| self.expr(x)),
            ExprKind::If { branches, otherwise } => {
                for (c, b) in branches {
                    self.expr(c);
                    self.block(b, false);
                }
                if let Some(b) = otherwise {
                    self.block(b, false);
                }
            }
            ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Bool(_)
            | ExprKind::Str(_)
            | ExprKind::DType(_)
            | ExprKind::Error => {}
        }
    }

    fn module_binding(&self, name: &str) -> Option<ModId> {
        if self.locals.iter().any(|s| s.iter().any(|n| n == name)) {
            return None;
        }
        match self.prog.module(self.module).scope.get(name) {
            Some(Binding::Module { module, .. }) => Some(*module),
            _ => None,
        }
    }

    fn self_field(&mut self, field: &Ident, self_span: Span) {
        let Some(l) = self.layer else {
            self.diags.push(Diagnostic::error(
                "E0101",
                "`self` is only available inside a layer or model",
                self_span,
                "no enclosing layer",
            ));
            return;
        };
        let visible = &l.fields[..self.fields_visible];
        if visible.iter().any(|f| f.name.name == field.name) {
            return;
        }
        let later = l.fields[self.fields_visible..].iter().find(|f| f.name.name == field.name);
        let mut d = if let Some(later) = later {
            Diagnostic::error(
                "E0101",
                format!("field `{}` is used before it is defined", field.name),
                field.span,
                "used here",
            )
            .with_label(later.name.span, "defined later here")
            .with_help("fields are created in order; move this field below the one it uses")
        } else {
            Diagnostic::error(
                "E0101",
                format!("`{}` has no field `{}`", l.name.name, field.name),
                field.span,
                "unknown field",
            )
        };
        if later.is_none() {
            if let Some(c) = nearest(&field.name, visible.iter().map(|f| f.name.name.as_str())) {
                d = d.with_help(format!("did you mean `self.{c}`?"));
            }
        }
        self.diags.push(d);
    }

    fn resolves(&self, name: &str) -> bool {
        self.locals.iter().any(|s| s.iter().any(|n| n == name))
            || self.layer.is_some_and(|l| {
                l.params.iter().any(|p| p.name.name == name)
                    || l.fields[..self.fields_visible].iter().any(|f| f.name.name == name)
            })
            || self.prog.module(self.module).scope.contains_key(name)
            || self.prog.module(self.module).poisoned.iter().any(|n| n == name)
            || builtins::is_builtin(name)
    }

    fn name(&mut self, name: &str, span: Span) {
        if self.resolves(name) {
            return;
        }
        if let Some(l) = self.layer {
            if let Some(f) = l.fields[self.fields_visible..].iter().find(|f| f.name.name == name) {
                self.diags.push(
                    Diagnostic::error(
                        "E0101",
                        format!("field `{name}` is used before it is defined"),
                        span,
                        "used here",
                    )
                    .with_label(f.name.span, "defined later here")
                    .with_help(
                        "fields are created in order; move this field below the one it uses",
                    ),
                );
                return;
            }
        }
        let mut candidates: Vec<&str> = self.locals.iter().flatten().map(String::as_str).collect();
        if let Some(l) = self.layer {
            candidates.extend(l.params.iter().map(|p| p.name.name.as_str()));
            candidates.extend(l.fields[..self.fields_visible].iter().map(|f| f.name.name.as_str()));
        }
        candidates.extend(self.prog.module(self.module).scope.keys().map(String::as_str));
        for b in builtins::names() {
            candidates.push(b);
        }
        let mut d = Diagnostic::error(
            "E0101",
            format!("cannot find `{name}` in this scope"),
            span,
            "not found",
        );
        if let Some(c) = nearest(name, candidates) {
            d = d.with_help(format!("did you mean `{c}`?"));
        } else if let Some(module) = std_home(name) {
            d = d.with_help(format!(
                "`{name}` is defined in `std.{module}`; add `use std.{module}.{{{name}}}`"
            ));
        }
        self.diags.push(d);
    }
}

/// The stdlib module that defines `name`, for "add `use ...`" hints.
fn std_home(name: &str) -> Option<&'static str> {
    STDLIB.iter().find_map(|(module, text)| {
        let defines = ["layer ", "fn ", "const "].iter().any(|kw| {
            text.match_indices(&format!("{kw}{name}")).any(|(i, m)| {
                let after = text[i + m.len()..].chars().next();
                !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        });
        defines.then_some(*module)
    })
}
