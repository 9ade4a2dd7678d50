//! What the language server adds to the compiler's name resolution (`Program::resolution`,
//! which answers definition, references, hover, completion scopes and semantic tokens): the
//! name under the cursor, and the parameters of the call being typed, found from the text
//! before the cursor because a half-typed call may not parse.

use mgn_compiler::elab::builtins::Builtin;
use mgn_compiler::front::resolve::{field_layer, follow, global, layer_item, LayerRef};
use mgn_compiler::front::{ModId, Occurrence, Program, Resolution, Target};
use mgn_syntax::ast::*;

/// The innermost name at a byte offset of a file (the cursor may sit just after it).
pub fn at(res: &Resolution, file: mgn_syntax::FileId, offset: usize) -> Option<&Occurrence> {
    // A name that merely ends at the cursor loses to one that starts there (`x|+y`).
    res.occurrences()
        .iter()
        .filter(|o| o.span.file == file && o.span.contains(offset))
        .min_by_key(|o| (o.span.end as usize == offset && !o.span.is_empty(), o.span.len()))
}

/// What a call's named arguments are matched against.
pub enum Signature<'p> {
    /// A fn's, a layer's config or a forward's parameters.
    Params(&'p [Param]),
    Builtin(&'static Builtin),
}

/// The parameter list of what `callee` (a chain of names: `self.blocks`, `nn.Linear`)
/// calls, in the enclosing `layer` of `module`; `local_layer` gives the layer type a bare
/// name holds.
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
        name => match local_layer(name) {
            Some(l) => follow(prog, l, rest)?,
            None => {
                let (m, i) = match (global(prog, module, name)?, rest) {
                    (Target::Builtin(b), []) => return Some(Signature::Builtin(b)),
                    (Target::Item { module, index, .. }, []) => (module, index),
                    (Target::Module(m), [item]) => (m, prog.module(m).item_index(item)?),
                    _ => return None,
                };
                return match prog.item(m, i) {
                    Item::Fn(f) => Some(Signature::Params(&f.params)),
                    Item::Layer(l) => Some(Signature::Params(&l.params)),
                    _ => None,
                };
            }
        },
    };
    Some(Signature::Params(&layer_item(prog, l)?.forward.first()?.params))
}
