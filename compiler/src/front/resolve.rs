//! Name resolution, computed once per program by `resolve` and kept as `Program::resolution`:
//! for every name written in every module, what it refers to, and which names each scope
//! makes visible. The names check reports the `Problem`s found here, the evaluator reads from
//! here which binding, item or builtin a name denotes, and the language server answers
//! definition, references, hover, completion and semantic tokens from it.
//!
//! The lookup order is written here (`walk::Resolver::lookup`) and nowhere else: the innermost
//! local binding first (a `let`, a parameter, a dim bound by a shape pattern, a `repeat`
//! index, then the enclosing layer's config parameters, fields defined so far and inputs),
//! then the module's items and imports, then the builtins. A name whose import failed
//! (already reported) refers to nothing and is no problem. Files with syntax errors resolve
//! too: items that did not parse are simply absent.
//!
//! Every item of every module is resolved, also layers no model instantiates, so the names
//! check finds typos in unused code.

mod walk;

use super::load::{Binding, ModId, Program};
use crate::elab::builtins::{self, Builtin};
use mgn_syntax::ast::*;
use mgn_syntax::Span;
use std::collections::HashMap;

/// A layer type: item `1` of module `0`.
pub type LayerRef = (ModId, usize);

/// What kind of definition a name refers to.
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

/// What a name refers to.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// A name defined inside an item (a local, parameter, config parameter, field, input, dim,
    /// repeat index or output): the span of its definition.
    Def {
        span: Span,
        kind: SymKind,
    },
    /// Item `index` of `module` (a layer, model, fn or const), named at `span`.
    Item {
        module: ModId,
        index: usize,
        span: Span,
        kind: SymKind,
    },
    Builtin(&'static Builtin),
    /// A whole module (`use std.nn`).
    Module(ModId),
}

impl Target {
    /// The definition's name span and kind; `None` for builtins and modules.
    pub fn def(self) -> Option<(Span, SymKind)> {
        match self {
            Target::Def { span, kind } | Target::Item { span, kind, .. } => Some((span, kind)),
            Target::Builtin(_) | Target::Module(_) => None,
        }
    }
}

/// One name as written, and what it refers to.
#[derive(Clone, Copy, Debug)]
pub struct Occurrence {
    pub span: Span,
    pub target: Target,
    /// True at the definition itself.
    pub def: bool,
    /// For the callee of a call: the whole call's span.
    pub call: Option<Span>,
}

/// A name visible within `scope` (`Span::default()` when it is reached only as `self.name`).
#[derive(Clone, Debug)]
pub struct Visible {
    pub name: String,
    pub def: Span,
    pub kind: SymKind,
    pub scope: Span,
    /// The layer type it holds, as far as syntax tells (a field holding `Linear(..)`).
    pub layer: Option<LayerRef>,
}

/// A name that refers to nothing, found at the span it is stored under.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// No definition of the name is visible here. `later_field` is a field of the enclosing
    /// layer with this name that is defined further down; `suggestion` a visible name near it.
    Unknown { name: String, later_field: Option<Span>, suggestion: Option<String> },
    /// `self` not followed by a field name.
    BareSelf,
    /// `self.x` outside any layer (stored at `self`).
    SelfOutsideLayer,
    /// `self.x` where the layer has no field `x` yet: `later` is where it is defined further
    /// down, if it is; otherwise `suggestion` is a field defined so far near it.
    NoField { layer: String, field: String, later: Option<Span>, suggestion: Option<String> },
    /// `m.x` where module `m` has no item `x`; `suggestion` is an item near it.
    NoItem { module: ModId, item: String, suggestion: Option<String> },
}

/// The names of a whole program, resolved.
#[derive(Default)]
pub struct Resolution {
    occurrences: Vec<Occurrence>,
    visible: Vec<Visible>,
    problems: HashMap<Span, Problem>,
    /// The occurrence written at each span.
    by_span: HashMap<Span, usize>,
}

impl Resolution {
    /// Every name that refers to something, in the order they were met.
    pub fn occurrences(&self) -> &[Occurrence] {
        &self.occurrences
    }

    /// Every name each scope defines.
    pub fn visible(&self) -> &[Visible] {
        &self.visible
    }

    /// The name written exactly at `span`, if it refers to something.
    pub fn occurrence(&self, span: Span) -> Option<&Occurrence> {
        self.by_span.get(&span).map(|&i| &self.occurrences[i])
    }

    /// What the name written exactly at `span` refers to.
    pub fn target(&self, span: Span) -> Option<Target> {
        self.occurrence(span).map(|o| o.target)
    }

    /// Why the name written exactly at `span` refers to nothing, if it does not.
    pub fn problem(&self, span: Span) -> Option<&Problem> {
        self.problems.get(&span)
    }
}

/// Resolves every name in every module of the program.
pub fn resolve(prog: &Program) -> Resolution {
    let mut r = walk::Resolver::new(prog);
    for (m, module) in prog.modules.iter().enumerate() {
        for (index, item) in module.ast.items.iter().enumerate() {
            r.item(ModId(m), index, item);
        }
    }
    r.finish()
}

/// What `name` refers to in `module` where no local binding has it: the module's items and
/// imports, then the builtins (the part of the lookup order after the locals).
pub fn global(prog: &Program, module: ModId, name: &str) -> Option<Target> {
    match prog.module(module).scope.get(name) {
        Some(Binding::Item { module, index, .. }) => item_target(prog, *module, *index),
        Some(Binding::Module { module, .. }) => Some(Target::Module(*module)),
        None => builtins::lookup(name).map(Target::Builtin),
    }
}

/// The target of item `index` of `module`.
pub fn item_target(prog: &Program, module: ModId, index: usize) -> Option<Target> {
    let item = prog.modules.get(module.0)?.ast.items.get(index)?;
    let kind = match item {
        Item::Use(_) => return None,
        Item::Const(_) => SymKind::Const,
        Item::Fn(_) => SymKind::Fn,
        Item::Layer(l) if l.kind == LayerKind::Model => SymKind::Model,
        Item::Layer(_) => SymKind::Layer,
    };
    Some(Target::Item { module, index, span: item.name()?.span, kind })
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

/// The layer a field holds, when its initializer calls a layer type (`Linear(..)`,
/// `repeat(n) Block(..)`, `[Conv2d(..), ..]`; in a nested list or an `if`, the first layer
/// call found).
pub fn field_layer(prog: &Program, module: ModId, f: &FieldDef) -> Option<LayerRef> {
    match &f.init {
        FieldInit::Repeat { body, .. } => layer_call(prog, module, body),
        FieldInit::Expr(e) => layer_call(prog, module, e),
        FieldInit::Tensor { .. } => None,
    }
}

/// The layer type the first layer call of a field initializer makes, looking into lists and
/// the branches of an `if`.
fn layer_call(prog: &Program, module: ModId, e: &Expr) -> Option<LayerRef> {
    match &e.kind {
        ExprKind::List(items) => items.iter().find_map(|x| layer_call(prog, module, x)),
        ExprKind::If { branches, otherwise } => branches
            .iter()
            .map(|(_, b)| b)
            .chain(otherwise)
            .find_map(|b| layer_call(prog, module, b.tail.as_deref()?)),
        ExprKind::Call { callee, .. } => {
            let (m, i) = item_of(prog, module, callee)?;
            matches!(prog.item(m, i), Item::Layer(_)).then_some((m, i))
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

/// Follows a chain of field names from a layer type.
pub fn follow(prog: &Program, mut l: LayerRef, path: &[String]) -> Option<LayerRef> {
    for f in path {
        let field = layer_item(prog, l)?.fields.iter().find(|x| x.name.name == *f)?;
        l = field_layer(prog, l.0, field)?;
    }
    Some(l)
}

#[cfg(test)]
mod tests;
