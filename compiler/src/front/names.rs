//! The names check, over every item including layers no model instantiates (so
//! `mgnc check stdlib/nn.mgn` finds typos in unused code): each name that refers to nothing
//! (a `Problem` of the program's `Resolution`) becomes a diagnostic, and the structure rules
//! are checked on the way (inputs only in models, `output` and `loss` only at the top of a
//! model's forward, one forward, no duplicate members). Values and shapes are checked later,
//! during elaboration, where they are known.
//!
//! Diagnostics come out in the order of one walk over each item, the structure rules where
//! they apply; names inside a second `forward` or a model forward's return type are not
//! reported (the structure error is).

use super::load::{ModId, Program};
use super::resolve::Problem;
use super::{continued_call, paren_on_new_line, replace_with};
use crate::source::STDLIB;
use mgn_syntax::ast::*;
use mgn_syntax::visit::{self, Visit};
use mgn_syntax::{Diagnostic, Span};

pub fn check(prog: &Program) -> Vec<Diagnostic> {
    let mut c = Checker {
        prog,
        module: ModId(0),
        layer: None,
        top: false,
        model_forward: false,
        callee: None,
        continued: Vec::new(),
        diags: Vec::new(),
    };
    for (i, m) in prog.modules.iter().enumerate() {
        c.module = ModId(i);
        for item in &m.ast.items {
            c.visit_item(item);
        }
    }
    c.diags
}

struct Checker<'p> {
    prog: &'p Program,
    module: ModId,
    layer: Option<&'p LayerItem>,
    /// True for the block of a model's forward, whose statements may be `output` and `loss`.
    top: bool,
    /// True anywhere inside a model's forward (where a missing name may be a missing input).
    model_forward: bool,
    /// The callee of the call being walked, when it is a bare name.
    callee: Option<Span>,
    /// Calls being walked whose `(` starts a line (callee, paren, arguments' span).
    continued: Vec<(Span, Span, Span)>,
    diags: Vec<Diagnostic>,
}

impl<'p> Visit<'p> for Checker<'p> {
    fn visit_use(&mut self, _: &'p UseItem) {}

    fn visit_param(&mut self, p: &'p Param) {
        if let (true, Some(d)) = (p.optional, &p.default) {
            self.diags.push(
                Diagnostic::error(
                    "E0107",
                    format!("optional parameter `{}?` has a default", p.name.name),
                    d.span,
                    "a default",
                )
                .with_help(format!(
                    "`{0}?` may be left out and then is not given; for a value when it is left \
                     out write `{0}: type = value` without the `?`",
                    p.name.name
                )),
            );
        }
        visit::walk_param(self, p);
    }

    fn visit_layer(&mut self, l: &'p LayerItem) {
        self.layer = Some(l);
        self.duplicates(l);
        for p in &l.params {
            self.visit_param(p);
        }
        if l.kind == LayerKind::Layer {
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
        for f in &l.fields {
            self.visit_field(f);
        }
        // Input shapes may use fields (`input x: f32[B, self_dim]`): they are created after.
        for i in &l.inputs {
            self.visit_tensor_type(&i.ty);
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
            self.visit_forward(fwd);
        }
        if l.kind == LayerKind::Model && l.forward.is_empty() {
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
        self.layer = None;
    }

    fn visit_forward(&mut self, fwd: &'p ForwardDef) {
        let Some(l) = self.layer else { return visit::walk_forward(self, fwd) };
        let is_model = l.kind == LayerKind::Model;
        if let (true, Some(p)) = (is_model, fwd.params.first()) {
            self.diags.push(
                Diagnostic::error(
                    "E0107",
                    "a model's `forward` takes no parameters",
                    p.span,
                    "parameter of a model forward",
                )
                .with_help(format!("declare it as a model input: `input {}: ...`", p.name.name)),
            );
        }
        for p in &fwd.params {
            self.visit_param(p);
        }
        match &fwd.ret {
            Some(r) if is_model => self.diags.push(
                Diagnostic::error(
                    "E0107",
                    "a model's `forward` has no return type",
                    r.span(),
                    "not allowed on a model",
                )
                .with_help("name what the model produces with `output name = ...` statements"),
            ),
            Some(r) => self.visit_type(r),
            None => {}
        }
        self.top = is_model;
        self.model_forward = is_model;
        self.visit_block(&fwd.body);
        self.model_forward = false;
        if is_model {
            self.model_body(l, fwd);
        } else if fwd.body.tail.is_none() {
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
    }

    fn visit_block(&mut self, b: &'p Block) {
        let top = std::mem::replace(&mut self.top, false);
        for s in &b.stmts {
            match s {
                Stmt::Output { span, .. } => self.placement(top, "output", *span),
                Stmt::Loss { span, .. } => self.placement(top, "loss", *span),
                Stmt::Let { .. } | Stmt::Assign { .. } => {}
            }
            self.visit_stmt(s);
        }
        if let Some(t) = &b.tail {
            self.visit_expr(t);
        }
    }

    fn visit_expr(&mut self, e: &'p Expr) {
        match &e.kind {
            ExprKind::Name(_) | ExprKind::SelfRef => self.report(e.span),
            ExprKind::Call { callee, .. } => {
                if let ExprKind::Name(_) = callee.kind {
                    self.callee = Some(callee.span);
                }
                let paren = paren_on_new_line(self.prog, callee.span, e.span);
                if let Some(paren) = paren {
                    let args = Span { start: paren.start, ..e.span };
                    self.continued.push((callee.span, paren, args));
                }
                visit::walk_expr(self, e);
                if paren.is_some() {
                    self.continued.pop();
                }
                return;
            }
            _ => {}
        }
        visit::walk_expr(self, e);
    }

    /// Field names after `.` and the name of `output name`.
    fn visit_ident(&mut self, i: &'p Ident) {
        self.report(i.span);
    }
}

impl Checker<'_> {
    /// What a model's forward must and must not contain.
    fn model_body(&mut self, l: &LayerItem, fwd: &ForwardDef) {
        let produces =
            fwd.body.stmts.iter().any(|s| matches!(s, Stmt::Output { .. } | Stmt::Loss { .. }));
        if !produces {
            self.diags.push(
                Diagnostic::error(
                    "E0107",
                    format!("model `{}` produces nothing", l.name.name),
                    fwd.span,
                    "no `output` or `loss` in this forward",
                )
                .with_help(
                    "add `output name = expr` for each result, and `loss expr` for training",
                ),
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

    fn placement(&mut self, top: bool, what: &str, span: Span) {
        if top {
            return;
        }
        let mut d = Diagnostic::error(
            "E0107",
            format!("`{what}` is only allowed at the top of a model's forward"),
            span,
            format!("`{what}` here"),
        );
        if self.layer.is_some_and(|l| l.kind == LayerKind::Layer) {
            d = d.with_help(concat!(
                "a layer returns its result as the last expression of its forward; ",
                "the model that uses it declares outputs and the loss"
            ));
        }
        self.diags.push(d);
    }

    /// Reports the name written at `span` if it refers to nothing.
    fn report(&mut self, span: Span) {
        let Some(p) = self.prog.resolution.problem(span) else { return };
        let d = match p {
            Problem::Unknown { name, later_field: Some(later), .. } => {
                used_before_defined(name, span, *later)
            }
            Problem::Unknown { name, later_field: None, suggestion } => {
                match self.input_in_field(name, span) {
                    Some(d) => d,
                    None => self.unknown(name, suggestion.as_deref(), span),
                }
            }
            Problem::BareSelf => Diagnostic::error(
                "E0101",
                "`self` must be followed by a field name",
                span,
                "expected `self.field`",
            ),
            Problem::SelfOutsideLayer => Diagnostic::error(
                "E0101",
                "`self` is only available inside a layer or model",
                span,
                "no enclosing layer",
            ),
            Problem::NoField { field, later: Some(later), .. } => {
                used_before_defined(field, span, *later)
            }
            Problem::NoField { layer, field, later: None, suggestion } => {
                let d = Diagnostic::error(
                    "E0101",
                    format!("`{layer}` has no field `{field}`"),
                    span,
                    "unknown field",
                );
                match suggestion {
                    Some(c) => {
                        replace_with(d.with_help(format!("did you mean `self.{c}`?")), span, c)
                    }
                    None => d,
                }
            }
            Problem::NoItem { module, item, suggestion } => {
                let d = Diagnostic::error(
                    "E0103",
                    format!("`{}` has no item named `{item}`", self.prog.module(*module).name),
                    span,
                    "not found in this module",
                );
                match suggestion {
                    Some(c) => replace_with(d.with_help(format!("did you mean `{c}`?")), span, c),
                    None => d,
                }
            }
        };
        self.diags.push(d);
    }
}

impl Checker<'_> {
    /// An input of the model read outside its forward — in a field, whose value is made once
    /// before any run has inputs, or in an input's shape. In a computed `init` it is what
    /// LANGUAGE.md says an `init` may not read.
    fn input_in_field(&self, name: &str, span: Span) -> Option<Diagnostic> {
        let model = self.layer.filter(|l| l.kind == LayerKind::Model && !self.model_forward)?;
        let input = model.inputs.iter().find(|i| i.name.name == name)?;
        let in_init = model.fields.iter().any(|f| match &f.init {
            FieldInit::Tensor { init: Some(e), .. } => {
                e.span.start <= span.start && span.end <= e.span.end
            }
            _ => false,
        });
        let d = if in_init {
            Diagnostic::error(
                "E0201",
                format!(
                    "an `init` must be computed from constants alone, but this one reads input \
                     `{name}`"
                ),
                span,
                "not a constant",
            )
            .with_help(
                "a field's initial value cannot depend on inputs or other fields; compute it from \
                 numbers, `arange` and the model's arguments",
            )
        } else {
            Diagnostic::error(
                "E0201",
                format!("input `{name}` is read outside the model's forward"),
                span,
                "an input",
            )
            .with_help(
                "fields (and input shapes) are made once, before any run has inputs: read inputs \
                 in `forward`",
            )
        };
        Some(d.with_label(input.name.span, "declared here"))
    }

    /// A name that refers to nothing, with the likeliest fix: the stdlib item of exactly that
    /// name, a near name, an input the model does not declare yet; or, inside a call whose `(`
    /// starts a line, that the line continued the one above.
    fn unknown(&mut self, name: &str, suggestion: Option<&str>, span: Span) -> Diagnostic {
        let d = Diagnostic::error(
            "E0101",
            format!("cannot find `{name}` in this scope"),
            span,
            "not found",
        );
        if let Some(&(callee, paren, _)) =
            self.continued.iter().rev().find(|(_, _, args)| args.contains(span.start as usize))
        {
            return continued_call(self.prog, d, callee, paren);
        }
        let called = self.callee == Some(span);
        if let Some(ours) = pytorch_name(name) {
            let d = d.with_help(format!("`{name}` is PyTorch's name; in mgn it is `{ours}`"));
            // Where the arguments are the same, only the name changes (`detach(x)`).
            return match ours.strip_suffix("(x)").or(ours.strip_suffix("(x, min, max)")) {
                Some(same_args) if called => replace_with(d, span, same_args),
                _ => d,
            };
        }
        let model = self.layer.filter(|l| l.kind == LayerKind::Model && self.model_forward);
        match (std_home(name), suggestion, model) {
            (Some(module), _, _) => {
                let d = d.with_help(format!(
                    "`{name}` is defined in `std.{module}`; add `use std.{module}.{{{name}}}`"
                ));
                let ast = &self.prog.module(self.module).ast;
                d.with_fix(super::fixes::add_import(ast, &self.prog.sources, span, module, name))
            }
            (None, Some(c), _) => {
                replace_with(d.with_help(format!("did you mean `{c}`?")), span, c)
            }
            (None, None, Some(m)) if !called && !CONTEXTUAL.contains(&name) => {
                d.with_help(format!(
                    "if `{name}` is an input of the model, declare it in `{}`: \
                 `input {name}: f32[...]`; otherwise bind it with `let {name} = ...` first",
                    m.name.name
                ))
            }
            (None, None, _) => d,
        }
    }
}

/// Words that are keywords where a statement or member starts: a missing one of these is a
/// half-typed statement, not a missing input.
const CONTEXTUAL: &[&str] = &["input", "output", "loss", "param", "buffer", "init"];

fn used_before_defined(name: &str, span: Span, later: Span) -> Diagnostic {
    Diagnostic::error(
        "E0101",
        format!("field `{name}` is used before it is defined"),
        span,
        "used here",
    )
    .with_label(later, "defined later here")
    .with_help("fields are created in order; move this field below the one it uses")
}

/// The stdlib module that defines `name`, for "add `use ...`" hints.
/// PyTorch functions whose mgn builtin has another name (a spelling distance finds none of
/// these), as that builtin is called.
const PYTORCH_NAMES: &[(&str, &str)] = &[
    ("detach", "stop_gradient(x)"),
    ("cat", "concat([a, b], axis)"),
    ("view", "reshape(x, shape)"),
    ("chunk", "split(x, parts, axis)"),
    ("clip", "clamp(x, min, max)"),
    ("masked_fill", "where(mask, value, x)"),
    ("mm", "a @ b"),
    ("bmm", "a @ b"),
];

fn pytorch_name(name: &str) -> Option<&'static str> {
    PYTORCH_NAMES.iter().find(|(theirs, _)| *theirs == name).map(|(_, ours)| *ours)
}

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
