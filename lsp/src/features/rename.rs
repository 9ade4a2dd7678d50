//! Rename (`textDocument/rename`, `textDocument/prepareRename`): every occurrence the compiler
//! resolved to the same definition, in the open files and the files they import.
//!
//! A rename is refused, with a message the editor shows, when it would change what some name
//! means: the new name is already defined in a scope the renamed one shares (the same scope, one
//! inside it or around it, the module's items and imports), or a use of the renamed one would
//! then find another binding. Builtins, modules and whatever the standard library defines are
//! not renamed; a file with syntax errors is not either (names in the items that do not parse
//! are unknown, so some uses would be missed).

use super::*;
use mgn_compiler::front::Binding;

/// Words the grammar reserves: never a name.
const RESERVED: &[&str] = &[
    "use", "const", "fn", "layer", "model", "forward", "repeat", "let", "if", "else", "true",
    "false", "self", "as", "f32", "f16", "bf16", "i32", "i64", "u32",
];

/// The name under the cursor that a rename would change, as the editor should show it.
pub fn prepare_rename(ctx: &Ctx, offset: usize) -> Result<lsp::PrepareRenameResponse, String> {
    let plan = Plan::at(ctx, offset)?;
    Ok(lsp::PrepareRenameResponse::RangeWithPlaceholder {
        range: range_of(ctx.this, plan.at.span),
        placeholder: plan.spelled,
    })
}

/// The edits that rename the name under the cursor to `new_name`, file by file.
pub fn rename(ctx: &Ctx, offset: usize, new_name: &str) -> Result<lsp::WorkspaceEdit, String> {
    let plan = Plan::at(ctx, offset)?;
    check_name(new_name)?;
    let sites = plan.sites(ctx);
    for (b, span) in &sites {
        let m = module_of(b, span.file).map(|m| b.program().module(m));
        if m.is_some_and(|m| !m.ast.unparsed.is_empty()) {
            let name = &b.program().sources.get(span.file).name;
            return Err(format!("`{name}` has syntax errors; fix them before renaming"));
        }
    }
    if new_name != plan.spelled {
        plan.clashes(ctx, &sites, new_name)?;
    }
    let mut changes: HashMap<lsp::Uri, Vec<lsp::TextEdit>> = HashMap::new();
    let mut seen = HashSet::new();
    for (b, span) in &sites {
        let Some(loc) = location_of(ctx.paths, b, *span) else { continue };
        if seen.insert((loc.uri.clone(), loc.range.start, loc.range.end)) {
            let edit = lsp::TextEdit { range: loc.range, new_text: new_name.to_string() };
            changes.entry(loc.uri).or_default().push(edit);
        }
    }
    for edits in changes.values_mut() {
        edits.sort_by_key(|e| (e.range.start.line, e.range.start.character));
    }
    Ok(lsp::WorkspaceEdit { changes: Some(changes), ..Default::default() })
}

/// A name of the language: letters, digits and `_`, not starting with a digit, not reserved,
/// not a builtin's.
fn check_name(name: &str) -> Result<(), String> {
    let b = name.as_bytes();
    if b.is_empty() || b[0].is_ascii_digit() || !b.iter().all(|&c| ident_char(c)) {
        return Err(format!("`{name}` is not a name: use letters, digits and `_`"));
    }
    if RESERVED.contains(&name) {
        return Err(format!("`{name}` is a reserved word"));
    }
    if builtins::lookup(name).is_some() {
        return Err(format!("`{name}` is a builtin; a definition of that name would hide it"));
    }
    Ok(())
}

/// What a rename at the cursor changes.
struct Plan {
    /// The name under the cursor.
    at: Occurrence,
    /// How it is written there.
    spelled: String,
    /// The definition: its file, span and kind.
    def: (Origin, Span, SymKind),
    /// The cursor is on an alias (`S` of `use "./b.mgn".{Scale as S}`): only the names spelled
    /// that way in this file change.
    alias: bool,
}

impl Plan {
    fn at(ctx: &Ctx, offset: usize) -> Result<Plan, String> {
        let a = ctx.this;
        let at = *resolve::at(a.names(), a.root_file(), offset)
            .ok_or("there is no name here to rename")?;
        let spelled = snippet(a, at.span).to_string();
        let (span, kind) = match at.target {
            Target::Builtin(b) if b.name == spelled => {
                return Err(format!("`{spelled}` is a builtin and cannot be renamed"));
            }
            Target::Builtin(b) => {
                return Err(format!("`{spelled}` is an argument of the builtin `{}`", b.name));
            }
            Target::Module(m) => {
                let name = &a.program().module(m).name;
                return Err(format!("`{spelled}` names the module `{name}`, which is not renamed"));
            }
            Target::Def { span, kind } | Target::Item { span, kind, .. } => (span, kind),
        };
        let alias = snippet(a, span) != spelled;
        if is_std(a, span.file) && !alias {
            let module = &a.program().sources.get(span.file).name;
            return Err(format!(
                "`{spelled}` is defined in the standard library ({module}) and cannot be renamed"
            ));
        }
        let origin = a.program().sources.get(span.file).origin.clone();
        Ok(Plan { at, spelled, def: (origin, span, kind), alias })
    }

    /// Whether `t` (in analysis `b`) is the renamed definition.
    fn same(&self, b: &Analysis, t: Target) -> bool {
        let (origin, span, _) = &self.def;
        t.def().is_some_and(|(s, _)| {
            s.start == span.start
                && s.end == span.end
                && &b.program().sources.get(s.file).origin == origin
        })
    }

    /// Every occurrence to rename, with the analysis it was found in.
    fn sites<'a>(&self, ctx: &Ctx<'a>) -> Vec<(&'a Arc<Analysis>, Span)> {
        let here = &ctx.this.program().sources.get(self.at.span.file).origin;
        let mut out = Vec::new();
        for b in std::iter::once(ctx.this).chain(ctx.all.iter()) {
            for o in b.names().occurrences() {
                let origin = &b.program().sources.get(o.span.file).origin;
                if !self.same(b, o.target)
                    || snippet(b, o.span) != self.spelled
                    || is_std(b, o.span.file)
                    || (self.alias && origin != here)
                {
                    continue;
                }
                out.push((b, o.span));
            }
        }
        out
    }

    /// Why renaming to `new` would change what a name means, if it would.
    fn clashes(
        &self,
        ctx: &Ctx,
        sites: &[(&Arc<Analysis>, Span)],
        new: &str,
    ) -> Result<(), String> {
        let a = ctx.this;
        let Some(def_file) = a.file_of(&self.def.0) else { return Ok(()) };
        let def = Span { file: def_file, ..self.def.1 };
        let line = |b: &Analysis, s: Span| range_of(b, s).start.line + 1;
        let taken = |b: &Analysis, s: Span| {
            let f = &b.program().sources.get(s.file).name;
            Err(format!(
                "cannot rename to `{new}`: `{new}` is already defined here ({f}:{})",
                line(b, s)
            ))
        };
        // Names the same scopes define: module items and imports, then bindings in scopes that
        // share a place with the renamed one.
        for (b, span) in sites {
            if let Some(Binding::Item { span: s, .. } | Binding::Module { span: s, .. }) =
                module_of(b, span.file).and_then(|m| b.program().module(m).scope.get(new))
            {
                return taken(b, *s);
            }
        }
        let scopes = scopes_of(a, def);
        for v in a.names().visible() {
            if v.name == new && v.def.file == def.file && scopes.iter().any(|s| nested(*s, v.scope))
            {
                return taken(a, v.def);
            }
        }
        if let Some(s) = self.member_named(a, def, new) {
            return taken(a, s);
        }
        // A use of the renamed one inside a scope that binds `new` would find that binding.
        for (b, span) in sites {
            let hidden = b.names().visible().iter().find(|v| {
                v.name == new
                    && v.scope.file == span.file
                    && v.scope.contains(span.start as usize)
                    && v.def.start <= span.start
            });
            if let (Some(v), true) = (hidden, bare(b, *span)) {
                return taken(b, v.def);
            }
        }
        Ok(())
    }

    /// A member of the renamed one's layer (config parameter, field, input) or an output of
    /// its forward named `new`: members share a namespace even where scopes do not say so
    /// (a field reached only as `self.name`).
    fn member_named(&self, a: &Analysis, def: Span, new: &str) -> Option<Span> {
        let (_, item) = item_at(a.program(), def)?;
        let Item::Layer(l) = item else { return None };
        match self.def.2 {
            SymKind::Field | SymKind::Config | SymKind::Input => {
                let params = l.params.iter().map(|p| &p.name);
                let fields = l.fields.iter().map(|f| &f.name);
                let inputs = l.inputs.iter().map(|i| &i.name);
                params.chain(fields).chain(inputs).find(|n| n.name == new).map(|n| n.span)
            }
            SymKind::Output => a
                .names()
                .occurrences()
                .iter()
                .find(|o| {
                    o.def
                        && matches!(o.target, Target::Def { kind: SymKind::Output, .. })
                        && l.span.contains(o.span.start as usize)
                        && snippet(a, o.span) == new
                })
                .map(|o| o.span),
            _ => None,
        }
    }
}

/// The module whose file is `file`.
fn module_of(a: &Analysis, file: FileId) -> Option<ModId> {
    a.program().modules.iter().position(|m| m.file == file).map(ModId)
}

/// The scopes a definition binds its name in (none for items: those are module-wide).
fn scopes_of(a: &Analysis, def: Span) -> Vec<Span> {
    a.names()
        .visible()
        .iter()
        .filter(|v| v.def == def && v.scope != Span::default())
        .map(|v| v.scope)
        .collect()
}

/// Whether one span lies within the other.
fn nested(x: Span, y: Span) -> bool {
    x.file == y.file
        && ((x.start <= y.start && y.end <= x.end) || (y.start <= x.start && x.end <= y.end))
}

/// Whether the name at `span` is looked up by scope: not a member (`self.name`, `m.name`) and
/// not a named argument (`name = value` inside a call).
fn bare(a: &Analysis, span: Span) -> bool {
    let text = text_of(a, span.file);
    let before = text[..span.start as usize].trim_end();
    let after = text[span.end as usize..].trim_start();
    let named_argument = after.starts_with('=') && !after.starts_with("==");
    !before.ends_with('.') && !named_argument
}

#[cfg(test)]
mod tests;
