//! Walking the AST. `Visit` takes shared references and `VisitMut` (in `visit::mutable`)
//! mutable ones, in the spirit of syn's visitors: one method per kind of node, whose default
//! walks the node's children through the matching `walk_*` function. An implementation
//! overrides the methods for the nodes it cares about and calls `walk_*` to go on below them.
//!
//! Children are visited in the order they are evaluated, which is not always the order of the
//! text, so that a visitor tracking scopes meets every definition before its uses: a
//! parameter's default, then its type, then its name; a `let`'s value, then its type, then its
//! pattern; a field's `if` condition, then its initializer, then its name; a layer's config,
//! then its fields, then its inputs, then its `forward`; an `output`'s value, then its name.
//! Every span is passed to `visit_span`, last among its node's children.
//!
//! Both traits come from one description (`visitor!`), so they cannot drift apart.

use crate::ast::*;
use crate::span::Span;

/// Writes a visitor trait and its `walk_*` functions. `$lt` is the lifetime of the borrowed
/// tree (shared visitors only) and `$m` is `mut` for the mutable one; `& $($m)?` borrows a
/// child as the trait expects.
macro_rules! visitor {
    ($(#[$doc:meta])* $Visit:ident [$($lt:lifetime)?] [$($m:ident)?]) => {
        $(#[$doc])*
        pub trait $Visit<$($lt)?> {
            fn visit_file(&mut self, f: &$($lt)? $($m)? File) {
                walk_file(self, f)
            }
            fn visit_item(&mut self, item: &$($lt)? $($m)? Item) {
                walk_item(self, item)
            }
            fn visit_use(&mut self, u: &$($lt)? $($m)? UseItem) {
                walk_use(self, u)
            }
            fn visit_const(&mut self, c: &$($lt)? $($m)? ConstItem) {
                walk_const(self, c)
            }
            fn visit_fn(&mut self, f: &$($lt)? $($m)? FnItem) {
                walk_fn(self, f)
            }
            fn visit_layer(&mut self, l: &$($lt)? $($m)? LayerItem) {
                walk_layer(self, l)
            }
            fn visit_input(&mut self, i: &$($lt)? $($m)? InputDecl) {
                walk_input(self, i)
            }
            fn visit_field(&mut self, f: &$($lt)? $($m)? FieldDef) {
                walk_field(self, f)
            }
            fn visit_forward(&mut self, f: &$($lt)? $($m)? ForwardDef) {
                walk_forward(self, f)
            }
            fn visit_param(&mut self, p: &$($lt)? $($m)? Param) {
                walk_param(self, p)
            }
            fn visit_type(&mut self, t: &$($lt)? $($m)? TypeExpr) {
                walk_type(self, t)
            }
            fn visit_tensor_type(&mut self, t: &$($lt)? $($m)? TensorType) {
                walk_tensor_type(self, t)
            }
            fn visit_dim(&mut self, d: &$($lt)? $($m)? DimItem) {
                walk_dim(self, d)
            }
            fn visit_block(&mut self, b: &$($lt)? $($m)? Block) {
                walk_block(self, b)
            }
            fn visit_stmt(&mut self, s: &$($lt)? $($m)? Stmt) {
                walk_stmt(self, s)
            }
            fn visit_pattern(&mut self, p: &$($lt)? $($m)? Pattern) {
                walk_pattern(self, p)
            }
            fn visit_expr(&mut self, e: &$($lt)? $($m)? Expr) {
                walk_expr(self, e)
            }
            fn visit_arg(&mut self, a: &$($lt)? $($m)? Arg) {
                walk_arg(self, a)
            }
            fn visit_ident(&mut self, i: &$($lt)? $($m)? Ident) {
                walk_ident(self, i)
            }
            fn visit_span(&mut self, _span: &$($lt)? $($m)? Span) {}
        }

        pub fn walk_file<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(v: &mut V, f: &$($lt)? $($m)? File) {
            for item in & $($m)? f.items {
                v.visit_item(item);
            }
        }

        pub fn walk_item<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            item: &$($lt)? $($m)? Item,
        ) {
            match item {
                Item::Use(u) => v.visit_use(u),
                Item::Const(c) => v.visit_const(c),
                Item::Fn(f) => v.visit_fn(f),
                Item::Layer(l) => v.visit_layer(l),
            }
        }

        pub fn walk_use<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            u: &$($lt)? $($m)? UseItem,
        ) {
            match & $($m)? u.source {
                UseSource::Path(path) => {
                    for segment in path {
                        v.visit_ident(segment);
                    }
                }
                UseSource::File { span, .. } => v.visit_span(span),
            }
            if let Some(names) = & $($m)? u.names {
                for n in names {
                    v.visit_ident(& $($m)? n.name);
                    if let Some(alias) = & $($m)? n.alias {
                        v.visit_ident(alias);
                    }
                }
            }
            if let Some(alias) = & $($m)? u.alias {
                v.visit_ident(alias);
            }
            v.visit_span(& $($m)? u.span);
        }

        pub fn walk_const<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            c: &$($lt)? $($m)? ConstItem,
        ) {
            v.visit_ident(& $($m)? c.name);
            if let Some(t) = & $($m)? c.ty {
                v.visit_type(t);
            }
            v.visit_expr(& $($m)? c.value);
            v.visit_span(& $($m)? c.span);
        }

        pub fn walk_fn<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(v: &mut V, f: &$($lt)? $($m)? FnItem) {
            v.visit_ident(& $($m)? f.name);
            for p in & $($m)? f.params {
                v.visit_param(p);
            }
            if let Some(t) = & $($m)? f.ret {
                v.visit_type(t);
            }
            v.visit_block(& $($m)? f.body);
            v.visit_span(& $($m)? f.span);
        }

        pub fn walk_layer<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            l: &$($lt)? $($m)? LayerItem,
        ) {
            v.visit_ident(& $($m)? l.name);
            for p in & $($m)? l.params {
                v.visit_param(p);
            }
            for f in & $($m)? l.fields {
                v.visit_field(f);
            }
            for i in & $($m)? l.inputs {
                v.visit_input(i);
            }
            for f in & $($m)? l.forward {
                v.visit_forward(f);
            }
            v.visit_span(& $($m)? l.span);
        }

        pub fn walk_input<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            i: &$($lt)? $($m)? InputDecl,
        ) {
            v.visit_tensor_type(& $($m)? i.ty);
            v.visit_ident(& $($m)? i.name);
            v.visit_span(& $($m)? i.span);
        }

        pub fn walk_field<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            f: &$($lt)? $($m)? FieldDef,
        ) {
            if let Some(c) = & $($m)? f.cond {
                v.visit_expr(c);
            }
            match & $($m)? f.init {
                FieldInit::Tensor { ty, init, .. } => {
                    v.visit_tensor_type(ty);
                    if let Some(e) = init {
                        v.visit_expr(e);
                    }
                }
                FieldInit::Repeat { count, index, name, body } => {
                    v.visit_expr(count);
                    if let Some(i) = index {
                        v.visit_ident(i);
                    }
                    if let Some(n) = name {
                        v.visit_expr(n);
                    }
                    v.visit_expr(body);
                }
                FieldInit::Expr(e) => v.visit_expr(e),
            }
            v.visit_ident(& $($m)? f.name);
            v.visit_span(& $($m)? f.span);
        }

        pub fn walk_forward<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            f: &$($lt)? $($m)? ForwardDef,
        ) {
            for p in & $($m)? f.params {
                v.visit_param(p);
            }
            if let Some(t) = & $($m)? f.ret {
                v.visit_type(t);
            }
            v.visit_block(& $($m)? f.body);
            v.visit_span(& $($m)? f.span);
        }

        pub fn walk_param<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            p: &$($lt)? $($m)? Param,
        ) {
            if let Some(d) = & $($m)? p.default {
                v.visit_expr(d);
            }
            v.visit_type(& $($m)? p.ty);
            v.visit_ident(& $($m)? p.name);
            v.visit_span(& $($m)? p.span);
        }

        pub fn walk_type<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            t: &$($lt)? $($m)? TypeExpr,
        ) {
            match t {
                TypeExpr::Scalar(_, span) => v.visit_span(span),
                TypeExpr::Tensor(t) => v.visit_tensor_type(t),
                TypeExpr::Tuple(ts, span) => {
                    for t in ts {
                        v.visit_type(t);
                    }
                    v.visit_span(span);
                }
            }
        }

        pub fn walk_tensor_type<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            t: &$($lt)? $($m)? TensorType,
        ) {
            if let ElemType::Value(e) = & $($m)? t.dtype {
                v.visit_expr(e);
            }
            for d in & $($m)? t.dims {
                v.visit_dim(d);
            }
            v.visit_span(& $($m)? t.span);
        }

        pub fn walk_dim<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            d: &$($lt)? $($m)? DimItem,
        ) {
            match d {
                DimItem::Expr(e) => v.visit_expr(e),
                DimItem::Variadic(id) => v.visit_ident(id),
            }
        }

        pub fn walk_block<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            b: &$($lt)? $($m)? Block,
        ) {
            for s in & $($m)? b.stmts {
                v.visit_stmt(s);
            }
            if let Some(t) = & $($m)? b.tail {
                v.visit_expr(t);
            }
            v.visit_span(& $($m)? b.span);
        }

        pub fn walk_stmt<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            s: &$($lt)? $($m)? Stmt,
        ) {
            match s {
                Stmt::Let { pat, ty, value, span } => {
                    v.visit_expr(value);
                    if let Some(t) = ty {
                        v.visit_type(t);
                    }
                    v.visit_pattern(pat);
                    v.visit_span(span);
                }
                Stmt::Output { name, value, span } => {
                    if let Some(e) = value {
                        v.visit_expr(e);
                    }
                    v.visit_ident(name);
                    v.visit_span(span);
                }
                Stmt::Loss { value, span } => {
                    v.visit_expr(value);
                    v.visit_span(span);
                }
                Stmt::Assign { field, value, span } => {
                    v.visit_expr(value);
                    v.visit_ident(field);
                    v.visit_span(span);
                }
            }
        }

        pub fn walk_pattern<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            p: &$($lt)? $($m)? Pattern,
        ) {
            match p {
                Pattern::Name(id) => v.visit_ident(id),
                Pattern::Wildcard(span) => v.visit_span(span),
                Pattern::Tuple(ps, span) => {
                    for p in ps {
                        v.visit_pattern(p);
                    }
                    v.visit_span(span);
                }
            }
        }

        pub fn walk_expr<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            e: &$($lt)? $($m)? Expr,
        ) {
            match & $($m)? e.kind {
                ExprKind::Unary(_, a) | ExprKind::Transpose(a) => v.visit_expr(a),
                ExprKind::Binary(first, rest) => {
                    v.visit_expr(first);
                    for (_, b) in rest {
                        v.visit_expr(b);
                    }
                }
                ExprKind::Index(a, b) => {
                    v.visit_expr(a);
                    v.visit_expr(b);
                }
                ExprKind::Call { callee, args } => {
                    v.visit_expr(callee);
                    for a in args {
                        v.visit_arg(a);
                    }
                }
                ExprKind::Field(base, name) => {
                    v.visit_expr(base);
                    v.visit_ident(name);
                }
                ExprKind::Tuple(xs) | ExprKind::List(xs) => {
                    for x in xs {
                        v.visit_expr(x);
                    }
                }
                ExprKind::If { branches, otherwise } => {
                    for (c, b) in branches {
                        v.visit_expr(c);
                        v.visit_block(b);
                    }
                    if let Some(b) = otherwise {
                        v.visit_block(b);
                    }
                }
                ExprKind::Int(_)
                | ExprKind::Float(_)
                | ExprKind::Bool(_)
                | ExprKind::Str(_)
                | ExprKind::DType(_)
                | ExprKind::Name(_)
                | ExprKind::SelfRef
                | ExprKind::Error => {}
            }
            v.visit_span(& $($m)? e.span);
        }

        pub fn walk_arg<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(v: &mut V, a: &$($lt)? $($m)? Arg) {
            if let Some(n) = & $($m)? a.name {
                v.visit_ident(n);
            }
            v.visit_expr(& $($m)? a.value);
        }

        pub fn walk_ident<$($lt,)? V: $Visit<$($lt)?> + ?Sized>(
            v: &mut V,
            i: &$($lt)? $($m)? Ident,
        ) {
            v.visit_span(& $($m)? i.span);
        }
    };
}

visitor! {
    /// A walk over a borrowed AST; `'ast` lets an implementation keep references into it.
    Visit ['ast] []
}

/// The same walk over a mutable AST.
pub mod mutable {
    use crate::ast::*;
    use crate::span::Span;

    visitor! {
        /// A walk over a mutable AST (the formatter erases spans with it).
        VisitMut [] [mut]
    }
}

#[cfg(test)]
mod tests;
