//! Syntax-level name resolution over a loaded program: for every name in every module, what it
//! refers to. This mirrors the lookup order of `front::names` and the evaluator (locals, then
//! the layer's config and fields, then the module's items and imports, then builtins), and
//! works on files with errors: items that did not parse are simply absent.
//!
//! Definition, references, hover, completion scopes and semantic tokens are answered from it.

use mgn_compiler::elab::builtins::{self, Builtin};
use mgn_compiler::front::{Binding, ModId, Program};
use mgn_syntax::ast::*;
use mgn_syntax::Span;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymKind {
    /// A `let` binding.
    Local,
    /// A parameter of a `fn` or a `forward`.
    Param,
    /// A config parameter of a layer or model.
    Config,
    Field,
    Input,
    /// A dim bound by a shape pattern (`B` in `x: f32[B, T, d]`).
    Dim,
    /// The copy index of `repeat(n, i)`.
    Index,
    Output,
    Layer,
    Model,
    Fn,
    Const,
}

impl SymKind {
    pub fn describe(self) -> &'static str {
        match self {
            SymKind::Local => "let binding",
            SymKind::Param => "parameter",
            SymKind::Config => "config parameter",
            SymKind::Field => "field",
            SymKind::Input => "input",
            SymKind::Dim => "dim",
            SymKind::Index => "repeat index",
            SymKind::Output => "output",
            SymKind::Layer => "layer",
            SymKind::Model => "model",
            SymKind::Fn => "fn",
            SymKind::Const => "const",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// A definition: the span of its name.
    Def {
        span: Span,
        kind: SymKind,
    },
    Builtin(&'static Builtin),
    /// A whole module (`use std.nn`): its file.
    Module(ModId),
}

#[derive(Clone, Copy, Debug)]
pub struct Occurrence {
    /// The name as written here.
    pub span: Span,
    pub target: Target,
    /// True at the definition itself.
    pub def: bool,
    /// For the callee of a call: the whole call's span (its result type is a fact).
    pub call: Option<Span>,
}

/// A name visible within `scope` (for completion).
#[derive(Clone, Debug)]
pub struct Visible {
    pub name: String,
    pub def: Span,
    pub kind: SymKind,
    pub scope: Span,
}

#[derive(Default)]
pub struct Index {
    pub occurrences: Vec<Occurrence>,
    pub visible: Vec<Visible>,
}

impl Index {
    /// The innermost occurrence at a byte offset of a file (the cursor may sit just after it).
    pub fn at(&self, file: mgn_syntax::FileId, offset: usize) -> Option<&Occurrence> {
        // A name that merely ends at the cursor loses to one that starts there (`x|+y`).
        self.occurrences
            .iter()
            .filter(|o| o.span.file == file && o.span.contains(offset))
            .min_by_key(|o| (o.span.end as usize == offset && !o.span.is_empty(), o.span.len()))
    }
}

/// Resolves every name in every module of the program.
pub fn index(prog: &Program) -> Index {
    let mut out = Index::default();
    for (i, m) in prog.modules.iter().enumerate() {
        for item in &m.ast.items {
            let mut w =
                Walker { prog, module: ModId(i), layer: None, scopes: Vec::new(), out: &mut out };
            w.item(item);
        }
    }
    out
}

struct Scope {
    span: Span,
    names: Vec<(String, Span, SymKind, Option<LayerRef>)>,
}

/// A layer type: item `1` of module `0`.
pub type LayerRef = (ModId, usize);

struct Walker<'p, 'o> {
    prog: &'p Program,
    module: ModId,
    layer: Option<&'p LayerItem>,
    scopes: Vec<Scope>,
    out: &'o mut Index,
}

/// The name span and kind of item `index` of `module`.
pub fn item_target(prog: &Program, module: ModId, index: usize) -> Option<Target> {
    let item = prog.modules.get(module.0)?.ast.items.get(index)?;
    let kind = match item {
        Item::Use(_) => return None,
        Item::Const(_) => SymKind::Const,
        Item::Fn(_) => SymKind::Fn,
        Item::Layer(l) if l.kind == LayerKind::Model => SymKind::Model,
        Item::Layer(_) => SymKind::Layer,
    };
    Some(Target::Def { span: item.name()?.span, kind })
}

/// The layer a field holds, when its initializer calls a layer type (`Linear(..)`,
/// `repeat(n) Block(..)`, `[Conv2d(..), ..]`).
pub fn field_layer(prog: &Program, module: ModId, f: &FieldDef) -> Option<LayerRef> {
    let call = match &f.init {
        FieldInit::Repeat { body, .. } => body,
        FieldInit::Expr(Expr { kind: ExprKind::List(items), .. }) => items.first()?,
        FieldInit::Expr(e) => e,
        FieldInit::Tensor { .. } => return None,
    };
    let ExprKind::Call { callee, .. } = &call.kind else { return None };
    let (m, i) = item_of(prog, module, callee)?;
    matches!(prog.item(m, i), Item::Layer(_)).then_some((m, i))
}

/// The item an expression names at module scope: `Name` or `module.Name`.
pub fn item_of(prog: &Program, module: ModId, e: &Expr) -> Option<(ModId, usize)> {
    match &e.kind {
        ExprKind::Name(n) => match prog.module(module).scope.get(n)? {
            Binding::Item { module, index, .. } => Some((*module, *index)),
            Binding::Module { .. } => None,
        },
        ExprKind::Field(base, name) => {
            let ExprKind::Name(m) = &base.kind else { return None };
            let Binding::Module { module, .. } = prog.module(module).scope.get(m)? else {
                return None;
            };
            Some((*module, prog.module(*module).item_index(&name.name)?))
        }
        _ => None,
    }
}

pub fn layer_item(prog: &Program, l: LayerRef) -> Option<&LayerItem> {
    match prog.modules.get(l.0 .0)?.ast.items.get(l.1)? {
        Item::Layer(l) => Some(l),
        _ => None,
    }
}

/// What a call's named arguments are matched against.
pub enum Signature<'p> {
    /// The parameters, and whether they are a layer's config (else a fn's or forward's).
    Params(&'p [Param], SymKind),
    Builtin(&'static Builtin),
}

impl<'p, 'o> Walker<'p, 'o> {
    fn occ(&mut self, span: Span, target: Target, def: bool) {
        self.out.occurrences.push(Occurrence { span, target, def, call: None });
    }

    fn push(&mut self, span: Span) {
        self.scopes.push(Scope { span, names: Vec::new() });
    }

    fn pop(&mut self) {
        if let Some(s) = self.scopes.pop() {
            for (name, def, kind, _) in s.names {
                self.out.visible.push(Visible { name, def, kind, scope: s.span });
            }
        }
    }

    fn bind(&mut self, name: &Ident, kind: SymKind, layer: Option<LayerRef>) {
        self.occ(name.span, Target::Def { span: name.span, kind }, true);
        if let Some(s) = self.scopes.last_mut() {
            s.names.push((name.name.clone(), name.span, kind, layer));
        }
    }

    fn lookup_local(&self, name: &str) -> Option<(Span, SymKind, Option<LayerRef>)> {
        self.scopes
            .iter()
            .rev()
            .flat_map(|s| s.names.iter().rev())
            .find(|(n, ..)| n == name)
            .map(|(_, s, k, l)| (*s, *k, *l))
    }

    fn lookup(&self, name: &str) -> Option<Target> {
        if let Some((span, kind, _)) = self.lookup_local(name) {
            return Some(Target::Def { span, kind });
        }
        match self.prog.module(self.module).scope.get(name) {
            Some(Binding::Item { module, index, .. }) => item_target(self.prog, *module, *index),
            Some(Binding::Module { module, .. }) => Some(Target::Module(*module)),
            None => builtins::lookup(name).map(Target::Builtin),
        }
    }

    // ---- items ------------------------------------------------------------------------

    fn item(&mut self, item: &'p Item) {
        match item {
            Item::Use(u) => self.use_item(u),
            Item::Const(c) => {
                self.occ(
                    c.name.span,
                    Target::Def { span: c.name.span, kind: SymKind::Const },
                    true,
                );
                if let Some(t) = &c.ty {
                    self.ty(t, false);
                }
                self.expr(&c.value);
            }
            Item::Fn(f) => {
                self.occ(f.name.span, Target::Def { span: f.name.span, kind: SymKind::Fn }, true);
                self.push(f.span);
                self.params(&f.params, SymKind::Param);
                if let Some(r) = &f.ret {
                    self.ty(r, true);
                }
                self.block(&f.body);
                self.pop();
            }
            Item::Layer(l) => self.layer(l),
        }
    }

    fn use_item(&mut self, u: &'p UseItem) {
        let scope = &self.prog.module(self.module).scope;
        let bound = |name: &Ident| scope.get(&name.name).copied();
        // The module this `use` reads, found through any name it bound.
        let mut target_mod = None;
        let mut items: Vec<(Span, Target)> = Vec::new();
        match &u.names {
            Some(names) => {
                for n in names {
                    let local = n.alias.as_ref().unwrap_or(&n.name);
                    if let Some(Binding::Item { module, index, .. }) = bound(local) {
                        target_mod = Some(module);
                        if let Some(t) = item_target(self.prog, module, index) {
                            items.push((n.name.span, t));
                            if let Some(a) = &n.alias {
                                items.push((a.span, t));
                            }
                        }
                    }
                }
            }
            None => {
                let local = match (&u.alias, &u.source) {
                    (Some(a), _) => Some(a),
                    (None, UseSource::Path(p)) => p.last(),
                    _ => None,
                };
                match local.and_then(bound) {
                    Some(Binding::Module { module, .. }) => {
                        target_mod = Some(module);
                        if let Some(a) = &u.alias {
                            items.push((a.span, Target::Module(module)));
                        }
                    }
                    Some(Binding::Item { module, index, .. }) => {
                        target_mod = Some(module);
                        if let Some(t) = item_target(self.prog, module, index) {
                            if let UseSource::Path(p) = &u.source {
                                items.push((p[p.len() - 1].span, t));
                            }
                            if let Some(a) = &u.alias {
                                items.push((a.span, t));
                            }
                        }
                    }
                    None => {}
                }
            }
        }
        if let Some(m) = target_mod {
            match &u.source {
                UseSource::Path(p) => {
                    if let Some(seg) = p.get(1) {
                        items.push((seg.span, Target::Module(m)));
                    }
                }
                UseSource::File { span, .. } => items.push((*span, Target::Module(m))),
            }
        }
        for (span, t) in items {
            self.occ(span, t, false);
        }
    }

    fn layer(&mut self, l: &'p LayerItem) {
        let kind = if l.kind == LayerKind::Model { SymKind::Model } else { SymKind::Layer };
        self.occ(l.name.span, Target::Def { span: l.name.span, kind }, true);
        self.layer = Some(l);
        self.push(l.span);
        self.params(&l.params, SymKind::Config);
        for i in &l.inputs {
            self.tensor_type(&i.ty, false);
        }
        for f in &l.fields {
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
                    self.push(f.span);
                    if let Some(i) = index {
                        self.bind(i, SymKind::Index, None);
                    }
                    self.expr(body);
                    self.pop();
                }
                FieldInit::Expr(e) => self.expr(e),
            }
            let layer = field_layer(self.prog, self.module, f);
            if l.params.iter().any(|p| p.name.name == f.name.name) {
                // Reached only as `self.name`: the config parameter keeps the bare name.
                self.occ(
                    f.name.span,
                    Target::Def { span: f.name.span, kind: SymKind::Field },
                    true,
                );
                self.out.visible.push(Visible {
                    name: f.name.name.clone(),
                    def: f.name.span,
                    kind: SymKind::Field,
                    scope: Span::default(),
                });
            } else {
                self.bind(&f.name, SymKind::Field, layer);
            }
        }
        for i in &l.inputs {
            self.bind(&i.name, SymKind::Input, None);
        }
        for fwd in &l.forward {
            self.push(fwd.span);
            self.params(&fwd.params, SymKind::Param);
            if let Some(r) = &fwd.ret {
                self.ty(r, true);
            }
            self.block(&fwd.body);
            self.pop();
        }
        self.pop();
        self.layer = None;
    }

    fn params(&mut self, params: &'p [Param], kind: SymKind) {
        for p in params {
            if let Some(d) = &p.default {
                self.expr(d);
            }
            self.ty(&p.ty, true);
            self.bind(&p.name, kind, None);
        }
    }

    fn ty(&mut self, t: &'p TypeExpr, pattern: bool) {
        match t {
            TypeExpr::Scalar(..) => {}
            TypeExpr::Tensor(tt) => self.tensor_type(tt, pattern),
            TypeExpr::Tuple(ts, _) => ts.iter().for_each(|t| self.ty(t, pattern)),
        }
    }

    fn tensor_type(&mut self, t: &'p TensorType, pattern: bool) {
        for d in &t.dims {
            match d {
                DimItem::Variadic(id) => match self.lookup_local(&id.name) {
                    Some((span, kind, _)) => self.occ(id.span, Target::Def { span, kind }, false),
                    None if pattern => self.bind(id, SymKind::Dim, None),
                    None => {}
                },
                DimItem::Expr(Expr { kind: ExprKind::Name(n), span })
                    if pattern && self.lookup(n).is_none() =>
                {
                    self.bind(&Ident { name: n.clone(), span: *span }, SymKind::Dim, None);
                }
                DimItem::Expr(e) => self.expr(e),
            }
        }
    }

    fn block(&mut self, b: &'p Block) {
        self.push(b.span);
        for s in &b.stmts {
            match s {
                Stmt::Let { pat, ty, value, .. } => {
                    self.expr(value);
                    if let Some(t) = ty {
                        self.ty(t, true);
                    }
                    self.pattern(pat);
                }
                Stmt::Output { name, value, .. } => match value {
                    Some(v) => {
                        self.expr(v);
                        self.occ(
                            name.span,
                            Target::Def { span: name.span, kind: SymKind::Output },
                            true,
                        );
                    }
                    None => self.name(&name.name, name.span),
                },
                Stmt::Loss { value, .. } => self.expr(value),
            }
        }
        if let Some(t) = &b.tail {
            self.expr(t);
        }
        self.pop();
    }

    fn pattern(&mut self, p: &Pattern) {
        match p {
            Pattern::Name(id) => self.bind(id, SymKind::Local, None),
            Pattern::Wildcard(_) => {}
            Pattern::Tuple(ps, _) => ps.iter().for_each(|p| self.pattern(p)),
        }
    }

    fn name(&mut self, name: &str, span: Span) {
        if let Some(t) = self.lookup(name) {
            self.occ(span, t, false);
        }
    }

    // ---- expressions -------------------------------------------------------------------

    /// The layer type an expression evaluates to, as far as syntax tells.
    fn layer_of(&self, e: &Expr) -> Option<LayerRef> {
        match &e.kind {
            ExprKind::Name(n) => self.lookup_local(n).and_then(|(_, _, l)| l),
            ExprKind::Field(base, f) => {
                let fields: &[FieldDef] = match &base.kind {
                    ExprKind::SelfRef => &self.layer?.fields,
                    _ => {
                        let l = self.layer_of(base)?;
                        let fd = &layer_item(self.prog, l)?.fields;
                        let field = fd.iter().find(|x| x.name.name == f.name)?;
                        return field_layer(self.prog, l.0, field);
                    }
                };
                let field = fields.iter().find(|x| x.name.name == f.name)?;
                field_layer(self.prog, self.module, field)
            }
            ExprKind::Index(base, _) => self.layer_of(base),
            _ => None,
        }
    }

    /// The parameters a call's named arguments refer to.
    fn signature(&self, callee: &Expr) -> Option<Signature<'p>> {
        if let ExprKind::Name(n) = &callee.kind {
            if let (None, Some(Target::Builtin(b))) = (self.lookup_local(n), self.lookup(n)) {
                return Some(Signature::Builtin(b));
            }
        }
        if self.lookup_local_name(callee).is_none() {
            if let Some((m, i)) = item_of(self.prog, self.module, callee) {
                return match self.prog.item(m, i) {
                    Item::Fn(f) => Some(Signature::Params(&f.params, SymKind::Param)),
                    Item::Layer(l) => Some(Signature::Params(&l.params, SymKind::Config)),
                    _ => None,
                };
            }
        }
        let l = layer_item(self.prog, self.layer_of(callee)?)?;
        Some(Signature::Params(&l.forward.first()?.params, SymKind::Param))
    }

    fn lookup_local_name(&self, e: &Expr) -> Option<()> {
        match &e.kind {
            ExprKind::Name(n) => self.lookup_local(n).map(|_| ()),
            _ => None,
        }
    }

    fn expr(&mut self, e: &'p Expr) {
        match &e.kind {
            ExprKind::Name(n) => self.name(n, e.span),
            ExprKind::SelfRef => {}
            ExprKind::Field(base, field) => {
                match &base.kind {
                    ExprKind::SelfRef => {
                        if let Some(f) = self
                            .layer
                            .and_then(|l| l.fields.iter().find(|f| f.name.name == field.name))
                        {
                            self.occ(
                                field.span,
                                Target::Def { span: f.name.span, kind: SymKind::Field },
                                false,
                            );
                        }
                        return;
                    }
                    ExprKind::Name(n) => {
                        if let Some(Target::Module(m)) = self.lookup(n) {
                            self.occ(base.span, Target::Module(m), false);
                            if let Some(i) = self.prog.module(m).item_index(&field.name) {
                                if let Some(t) = item_target(self.prog, m, i) {
                                    self.occ(field.span, t, false);
                                }
                            }
                            return;
                        }
                    }
                    _ => {}
                }
                self.expr(base);
                if let Some(l) = self.layer_of(base) {
                    if let Some(f) = layer_item(self.prog, l)
                        .and_then(|l| l.fields.iter().find(|f| f.name.name == field.name))
                    {
                        self.occ(
                            field.span,
                            Target::Def { span: f.name.span, kind: SymKind::Field },
                            false,
                        );
                    }
                }
            }
            ExprKind::Unary(_, a) | ExprKind::Transpose(a) => self.expr(a),
            ExprKind::Binary(_, a, b) | ExprKind::Index(a, b) => {
                self.expr(a);
                self.expr(b);
            }
            ExprKind::Call { callee, args } => {
                let before = self.out.occurrences.len();
                self.expr(callee);
                // Mark the callee's last name (`f` in `m.f(..)`) with the call.
                let callee_name_end = callee.span.end;
                if let Some(o) = self.out.occurrences[before..]
                    .iter_mut()
                    .rev()
                    .find(|o| o.span.end == callee_name_end)
                {
                    o.call = Some(e.span);
                }
                let sig = self.signature(callee);
                for a in args {
                    if let (Some(name), Some(sig)) = (&a.name, &sig) {
                        match sig {
                            Signature::Params(ps, kind) => {
                                if let Some(p) = ps.iter().find(|p| p.name.name == name.name) {
                                    self.occ(
                                        name.span,
                                        Target::Def { span: p.name.span, kind: *kind },
                                        false,
                                    );
                                }
                            }
                            Signature::Builtin(b) => self.occ(name.span, Target::Builtin(b), false),
                        }
                    }
                    self.expr(&a.value);
                }
            }
            ExprKind::Tuple(xs) | ExprKind::List(xs) => xs.iter().for_each(|x| self.expr(x)),
            ExprKind::If { branches, otherwise } => {
                for (c, b) in branches {
                    self.expr(c);
                    self.block(b);
                }
                if let Some(b) = otherwise {
                    self.block(b);
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
}

/// The parameter list of what `callee` calls, resolved with the scopes of a finished index
/// (for named-argument completion).
pub fn signature_at<'p>(
    prog: &'p Program,
    module: ModId,
    layer: Option<&'p LayerItem>,
    callee: &[String],
    local_layer: impl Fn(&str) -> Option<LayerRef>,
) -> Option<Signature<'p>> {
    let (first, rest) = callee.split_first()?;
    let l = match first.as_str() {
        "self" => {
            let (f, rest) = rest.split_first()?;
            let field = layer?.fields.iter().find(|x| x.name.name == *f)?;
            let l = field_layer(prog, module, field)?;
            follow(prog, l, rest)?
        }
        name => {
            if let Some(l) = local_layer(name) {
                follow(prog, l, rest)?
            } else {
                let target = match prog.module(module).scope.get(name) {
                    Some(Binding::Item { module, index, .. }) if rest.is_empty() => {
                        Some((*module, *index))
                    }
                    Some(Binding::Module { module, .. }) if rest.len() == 1 => {
                        prog.module(*module).item_index(&rest[0]).map(|i| (*module, i))
                    }
                    None if rest.is_empty() => {
                        return builtins::lookup(name).map(Signature::Builtin)
                    }
                    _ => None,
                };
                let (m, i) = target?;
                return match prog.item(m, i) {
                    Item::Fn(f) => Some(Signature::Params(&f.params, SymKind::Param)),
                    Item::Layer(l) => Some(Signature::Params(&l.params, SymKind::Config)),
                    _ => None,
                };
            }
        }
    };
    Some(Signature::Params(&layer_item(prog, l)?.forward.first()?.params, SymKind::Param))
}

/// Follows a chain of field names from a layer type.
pub fn follow(prog: &Program, mut l: LayerRef, path: &[String]) -> Option<LayerRef> {
    for f in path {
        let field = layer_item(prog, l)?.fields.iter().find(|x| x.name.name == *f)?;
        l = field_layer(prog, l.0, field)?;
    }
    Some(l)
}
