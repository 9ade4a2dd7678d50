//! The walk that fills a `Resolution`: one `Visit` over each item with a stack of scopes,
//! binding names where elaboration binds them and looking every use up in `lookup`.

use super::{
    field_layer, global, item_of, item_target, layer_item, LayerRef, Occurrence, Problem,
    Resolution, SymKind, Target, Visible,
};
use crate::elab::builtins;
use crate::front::load::{Binding, ModId, Program};
use crate::front::nearest;
use mgn_syntax::ast::*;
use mgn_syntax::visit::{self, Visit};
use mgn_syntax::Span;
use std::collections::HashMap;

struct Scope {
    span: Span,
    names: Vec<Entry>,
}

/// A name bound in a scope.
struct Entry {
    name: String,
    def: Span,
    kind: SymKind,
    /// The layer type it holds, as far as syntax tells (fields and their copies).
    layer: Option<LayerRef>,
}

/// What looking a name up found.
enum Lookup {
    Found(Target),
    /// Its import failed and was reported already.
    Poisoned,
    Missing,
}

pub(super) struct Resolver<'p> {
    prog: &'p Program,
    module: ModId,
    /// The item being walked.
    item: usize,
    layer: Option<&'p LayerItem>,
    /// How many of the layer's fields exist at this point: the ones before the field being
    /// initialized, all of them in inputs and `forward`.
    fields_done: usize,
    scopes: Vec<Scope>,
    /// Where each name is bound in `scopes` (scope, entry), innermost last: a lookup costs the
    /// same however many names are in scope.
    bound: HashMap<String, Vec<(usize, usize)>>,
    /// True while walking a type whose bare dim names bind (parameter, return and `let`
    /// types).
    pattern: bool,
    out: Resolution,
}

impl<'p> Resolver<'p> {
    pub(super) fn new(prog: &'p Program) -> Resolver<'p> {
        Resolver {
            prog,
            module: ModId(0),
            item: 0,
            layer: None,
            fields_done: 0,
            scopes: Vec::new(),
            bound: HashMap::new(),
            pattern: false,
            out: Resolution::default(),
        }
    }

    pub(super) fn item(&mut self, module: ModId, index: usize, item: &'p Item) {
        self.module = module;
        self.item = index;
        self.visit_item(item);
    }

    pub(super) fn finish(self) -> Resolution {
        self.out
    }

    // ---- recording ----------------------------------------------------------------------

    fn record(&mut self, span: Span, target: Target, def: bool) {
        let index = self.out.occurrences.len();
        self.out.occurrences.push(Occurrence { span, target, def, call: None });
        self.out.by_span.entry(span).or_insert(index);
    }

    fn problem(&mut self, span: Span, p: Problem) {
        self.out.problems.entry(span).or_insert(p);
    }

    /// Records the definition of the item being walked.
    fn item_def(&mut self) {
        if let Some(t) = item_target(self.prog, self.module, self.item) {
            let (span, _) = t.def().expect("items are definitions");
            self.record(span, t, true);
        }
    }

    // ---- scopes -------------------------------------------------------------------------

    fn push(&mut self, span: Span) {
        self.scopes.push(Scope { span, names: Vec::new() });
    }

    fn pop(&mut self) {
        if let Some(s) = self.scopes.pop() {
            for e in &s.names {
                if let Some(places) = self.bound.get_mut(&e.name) {
                    places.pop();
                    if places.is_empty() {
                        self.bound.remove(&e.name);
                    }
                }
            }
            for e in s.names {
                self.out.visible.push(Visible {
                    name: e.name,
                    def: e.def,
                    kind: e.kind,
                    scope: s.span,
                    layer: e.layer,
                });
            }
        }
    }

    /// Binds a name in the innermost scope, recording its definition.
    fn bind(&mut self, name: &Ident, kind: SymKind, layer: Option<LayerRef>) {
        self.record(name.span, Target::Def { span: name.span, kind }, true);
        self.declare(name, kind, layer);
    }

    /// Binds a name in the innermost scope without recording an occurrence.
    fn declare(&mut self, name: &Ident, kind: SymKind, layer: Option<LayerRef>) {
        let depth = self.scopes.len();
        if let Some(s) = self.scopes.last_mut() {
            let place = (depth - 1, s.names.len());
            s.names.push(Entry { name: name.name.clone(), def: name.span, kind, layer });
            self.bound.entry(name.name.clone()).or_default().push(place);
        }
    }

    /// The innermost binding of `name`: the one declared last, since scopes only grow and
    /// shrink at the top.
    fn local(&self, name: &str) -> Option<&Entry> {
        let &(scope, entry) = self.bound.get(name)?.last()?;
        Some(&self.scopes[scope].names[entry])
    }

    /// The lookup order of the language: locals (innermost first), then `global`: the
    /// module's items and imports, then the builtins.
    fn lookup(&self, name: &str) -> Lookup {
        if let Some(e) = self.local(name) {
            return Lookup::Found(Target::Def { span: e.def, kind: e.kind });
        }
        match global(self.prog, self.module, name) {
            Some(t) => Lookup::Found(t),
            None if self.prog.module(self.module).poisoned.iter().any(|n| n == name) => {
                Lookup::Poisoned
            }
            None => Lookup::Missing,
        }
    }

    /// Whether a bare name in a shape pattern binds a new dim: when it refers to nothing, or
    /// only to a builtin (`f32[N, mean]` binds `mean`, as elaboration does).
    fn binds_dim(&self, name: &str) -> bool {
        matches!(self.lookup(name), Lookup::Missing | Lookup::Found(Target::Builtin(_)))
    }

    /// Resolves a use of `name` written at `span`.
    fn use_name(&mut self, name: &str, span: Span) {
        match self.lookup(name) {
            Lookup::Found(t) => self.record(span, t, false),
            Lookup::Poisoned => {}
            Lookup::Missing => {
                let p = self.unknown(name);
                self.problem(span, p);
            }
        }
    }

    fn unknown(&self, name: &str) -> Problem {
        let later_field = self
            .layer
            .and_then(|l| l.fields[self.fields_done..].iter().find(|f| f.name.name == name))
            .map(|f| f.name.span);
        let suggestion = match later_field {
            Some(_) => None,
            None => {
                let scope = &self.prog.module(self.module).scope;
                let mut candidates: Vec<&str> = self
                    .scopes
                    .iter()
                    .flat_map(|s| s.names.iter().map(|e| e.name.as_str()))
                    .chain(scope.keys().map(String::as_str))
                    .collect();
                for b in builtins::names() {
                    candidates.push(b);
                }
                nearest(name, candidates).map(str::to_string)
            }
        };
        Problem::Unknown { name: name.to_string(), later_field, suggestion }
    }

    // ---- members ------------------------------------------------------------------------

    /// Binds parameters one after another: a default and a type see the parameters before.
    fn params(&mut self, params: &'p [Param], kind: SymKind) {
        for p in params {
            if let Some(d) = &p.default {
                self.visit_expr(d);
            }
            self.pattern_type(&p.ty);
            self.bind(&p.name, kind, None);
        }
    }

    /// A layer's config parameters are visible to each other's defaults and types (the
    /// names check has always accepted that; elaboration reports a default that reads a
    /// parameter bound after it).
    fn config(&mut self, params: &'p [Param]) {
        for p in params {
            self.declare(&p.name, SymKind::Config, None);
        }
        for p in params {
            if let Some(d) = &p.default {
                self.visit_expr(d);
            }
            self.pattern_type(&p.ty);
            self.record(
                p.name.span,
                Target::Def { span: p.name.span, kind: SymKind::Config },
                true,
            );
        }
    }

    fn field(&mut self, l: &'p LayerItem, f: &'p FieldDef) {
        if let Some(c) = &f.cond {
            self.visit_expr(c);
        }
        match &f.init {
            FieldInit::Tensor { ty, init, .. } => {
                self.visit_tensor_type(ty);
                if let Some(i) = init {
                    self.visit_expr(i);
                }
            }
            FieldInit::Repeat { count, index, name, body } => {
                self.visit_expr(count);
                if let Some(n) = name {
                    self.visit_expr(n);
                }
                self.push(f.span);
                if let Some(i) = index {
                    self.bind(i, SymKind::Index, None);
                }
                self.visit_expr(body);
                self.pop();
            }
            FieldInit::Expr(e) => self.visit_expr(e),
        }
        let layer = field_layer(self.prog, self.module, f);
        if l.params.iter().any(|p| p.name.name == f.name.name) {
            // Reached only as `self.name`: the config parameter keeps the bare name.
            let target = Target::Def { span: f.name.span, kind: SymKind::Field };
            self.record(f.name.span, target, true);
            self.out.visible.push(Visible {
                name: f.name.name.clone(),
                def: f.name.span,
                kind: SymKind::Field,
                scope: Span::default(),
                layer,
            });
        } else {
            self.bind(&f.name, SymKind::Field, layer);
        }
    }

    fn forward(&mut self, l: &'p LayerItem, fwd: &'p ForwardDef) {
        self.push(fwd.span);
        self.params(&fwd.params, SymKind::Param);
        if let Some(r) = &fwd.ret {
            if l.kind == LayerKind::Model {
                // A model's forward has no return type (the names check says so); names
                // bound in one do not reach the body.
                self.push(r.span());
                self.pattern_type(r);
                self.pop();
            } else {
                self.pattern_type(r);
            }
        }
        self.visit_block(&fwd.body);
        self.pop();
    }

    /// Walks a type whose bare dim names bind.
    fn pattern_type(&mut self, t: &'p TypeExpr) {
        let saved = std::mem::replace(&mut self.pattern, true);
        self.visit_type(t);
        self.pattern = saved;
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
            self.record(span, t, false);
        }
    }

    // ---- expressions --------------------------------------------------------------------

    /// The layer type an expression evaluates to, as far as syntax tells.
    fn layer_of(&self, e: &Expr) -> Option<LayerRef> {
        match &e.kind {
            ExprKind::Name(n) => self.local(n).and_then(|e| e.layer),
            ExprKind::Field(base, f) => {
                let (module, fields) = match &base.kind {
                    ExprKind::SelfRef => (self.module, &self.layer?.fields),
                    _ => {
                        let l = self.layer_of(base)?;
                        (l.0, &layer_item(self.prog, l)?.fields)
                    }
                };
                let field = fields.iter().find(|x| x.name.name == f.name)?;
                field_layer(self.prog, module, field)
            }
            ExprKind::Index(base, _) => self.layer_of(base),
            _ => None,
        }
    }

    /// The parameters a call's named arguments refer to.
    fn signature(&self, callee: &Expr) -> Option<Signature<'p>> {
        let local_callee = match &callee.kind {
            ExprKind::Name(n) => self.local(n).is_some(),
            _ => false,
        };
        if let (ExprKind::Name(n), false) = (&callee.kind, local_callee) {
            if let Lookup::Found(Target::Builtin(b)) = self.lookup(n) {
                return Some(Signature::Builtin(b));
            }
        }
        if !local_callee {
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

    fn call(&mut self, call: &'p Expr, callee: &'p Expr, args: &'p [Arg]) {
        let before = self.out.occurrences.len();
        self.visit_expr(callee);
        // Mark the callee's last name (`f` in `m.f(..)`) with the call.
        if let Some(o) =
            self.out.occurrences[before..].iter_mut().rev().find(|o| o.span.end == callee.span.end)
        {
            o.call = Some(call.span);
        }
        let sig = self.signature(callee);
        for a in args {
            if let (Some(name), Some(sig)) = (&a.name, &sig) {
                match sig {
                    Signature::Params(ps, kind) => {
                        if let Some(p) = ps.iter().find(|p| p.name.name == name.name) {
                            let target = Target::Def { span: p.name.span, kind: *kind };
                            self.record(name.span, target, false);
                        }
                    }
                    Signature::Builtin(b) => self.record(name.span, Target::Builtin(b), false),
                }
            }
            self.visit_expr(&a.value);
        }
    }

    fn member(&mut self, base: &'p Expr, field: &'p Ident) {
        match &base.kind {
            ExprKind::SelfRef => return self.self_field(base.span, field),
            ExprKind::Name(n) => {
                if let Lookup::Found(Target::Module(m)) = self.lookup(n) {
                    self.record(base.span, Target::Module(m), false);
                    let module = self.prog.module(m);
                    match module.item_index(&field.name) {
                        Some(i) => {
                            if let Some(t) = item_target(self.prog, m, i) {
                                self.record(field.span, t, false);
                            }
                        }
                        None => {
                            let suggestion =
                                nearest(&field.name, module.item_names()).map(str::to_string);
                            let item = field.name.clone();
                            self.problem(
                                field.span,
                                Problem::NoItem { module: m, item, suggestion },
                            );
                        }
                    }
                    return;
                }
            }
            _ => {}
        }
        self.visit_expr(base);
        let l = self.layer_of(base).and_then(|l| layer_item(self.prog, l));
        if let Some(f) = l.and_then(|l| l.fields.iter().find(|f| f.name.name == field.name)) {
            self.record(field.span, Target::Def { span: f.name.span, kind: SymKind::Field }, false);
        }
    }

    fn self_field(&mut self, self_span: Span, field: &Ident) {
        let Some(l) = self.layer else {
            self.problem(self_span, Problem::SelfOutsideLayer);
            return;
        };
        if let Some(f) = l.fields.iter().find(|f| f.name.name == field.name) {
            self.record(field.span, Target::Def { span: f.name.span, kind: SymKind::Field }, false);
        }
        let (done, rest) = l.fields.split_at(self.fields_done);
        if done.iter().any(|f| f.name.name == field.name) {
            return;
        }
        let later = rest.iter().find(|f| f.name.name == field.name).map(|f| f.name.span);
        let suggestion = match later {
            Some(_) => None,
            None => nearest(&field.name, done.iter().map(|f| f.name.name.as_str())),
        };
        let p = Problem::NoField {
            layer: l.name.name.clone(),
            field: field.name.clone(),
            later,
            suggestion: suggestion.map(str::to_string),
        };
        self.problem(field.span, p);
    }
}

/// What a call's named arguments are matched against.
enum Signature<'p> {
    /// The parameters, and whether they are a layer's config (else a fn's or forward's).
    Params(&'p [Param], SymKind),
    Builtin(&'static builtins::Builtin),
}

impl<'p> Visit<'p> for Resolver<'p> {
    fn visit_use(&mut self, u: &'p UseItem) {
        self.use_item(u);
    }

    fn visit_const(&mut self, c: &'p ConstItem) {
        self.item_def();
        if let Some(t) = &c.ty {
            self.visit_type(t);
        }
        self.visit_expr(&c.value);
    }

    fn visit_fn(&mut self, f: &'p FnItem) {
        self.item_def();
        self.push(f.span);
        self.params(&f.params, SymKind::Param);
        if let Some(r) = &f.ret {
            self.pattern_type(r);
        }
        self.visit_block(&f.body);
        self.pop();
    }

    /// Config, fields in order, then inputs (whose shapes may use fields), then each forward;
    /// the order in which elaboration creates them.
    fn visit_layer(&mut self, l: &'p LayerItem) {
        self.item_def();
        self.layer = Some(l);
        self.fields_done = 0;
        self.push(l.span);
        self.config(&l.params);
        for (n, f) in l.fields.iter().enumerate() {
            self.fields_done = n;
            self.field(l, f);
        }
        self.fields_done = l.fields.len();
        for i in &l.inputs {
            self.visit_tensor_type(&i.ty);
        }
        for i in &l.inputs {
            self.bind(&i.name, SymKind::Input, None);
        }
        for fwd in &l.forward {
            self.forward(l, fwd);
        }
        self.pop();
        self.layer = None;
    }

    fn visit_tensor_type(&mut self, t: &'p TensorType) {
        if let ElemType::Value(e) = &t.dtype {
            self.visit_expr(e);
        }
        if !self.pattern {
            for d in &t.dims {
                match d {
                    DimItem::Variadic(id) => {
                        if let Some(e) = self.local(&id.name) {
                            let target = Target::Def { span: e.def, kind: e.kind };
                            self.record(id.span, target, false);
                        }
                    }
                    DimItem::Expr(e) => self.visit_expr(e),
                }
            }
            return;
        }
        // Bare names bind first, so `[n * 2, n]` binds `n` for the first axis too (as
        // elaboration matches them).
        let mut binders = Vec::new();
        let pattern = std::mem::replace(&mut self.pattern, false);
        for d in &t.dims {
            match d {
                DimItem::Variadic(id) => match self.local(&id.name) {
                    Some(e) => {
                        let target = Target::Def { span: e.def, kind: e.kind };
                        self.record(id.span, target, false);
                    }
                    None => self.bind(id, SymKind::Dim, None),
                },
                DimItem::Expr(Expr { kind: ExprKind::Name(n), span }) if self.binds_dim(n) => {
                    self.bind(&Ident { name: n.clone(), span: *span }, SymKind::Dim, None);
                    binders.push(*span);
                }
                DimItem::Expr(_) => {}
            }
        }
        for d in &t.dims {
            if let DimItem::Expr(e) = d {
                if !binders.contains(&e.span) {
                    self.visit_expr(e);
                }
            }
        }
        self.pattern = pattern;
    }

    fn visit_block(&mut self, b: &'p Block) {
        self.push(b.span);
        visit::walk_block(self, b);
        self.pop();
    }

    fn visit_stmt(&mut self, s: &'p Stmt) {
        match s {
            Stmt::Let { pat, ty, value, .. } => {
                self.visit_expr(value);
                if let Some(t) = ty {
                    self.pattern_type(t);
                }
                self.visit_pattern(pat);
            }
            Stmt::Output { name, value: Some(v), .. } => {
                self.visit_expr(v);
                self.record(
                    name.span,
                    Target::Def { span: name.span, kind: SymKind::Output },
                    true,
                );
            }
            Stmt::Output { name, value: None, .. } => self.use_name(&name.name, name.span),
            Stmt::Loss { value, .. } => self.visit_expr(value),
            Stmt::Assign { field, value, span } => {
                self.visit_expr(value);
                self.self_field(*span, field);
            }
        }
    }

    fn visit_pattern(&mut self, p: &'p Pattern) {
        match p {
            Pattern::Name(id) => self.bind(id, SymKind::Local, None),
            _ => visit::walk_pattern(self, p),
        }
    }

    fn visit_expr(&mut self, e: &'p Expr) {
        match &e.kind {
            ExprKind::Name(n) => self.use_name(n, e.span),
            ExprKind::SelfRef => self.problem(e.span, Problem::BareSelf),
            ExprKind::Field(base, field) => self.member(base, field),
            ExprKind::Call { callee, args } => self.call(e, callee, args),
            _ => visit::walk_expr(self, e),
        }
    }
}
