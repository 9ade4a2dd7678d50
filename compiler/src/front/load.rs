//! Loads a root file and everything it imports into a `Program`, builds each module's scope
//! of items and imports, and resolves every name once (`resolve`).

use super::did_you_mean;
use super::resolve::{resolve, Resolution};
pub use crate::source::io_reason;
use crate::source::{normalize, read_source, std_source, Origin, SourceMap, STDLIB};
use mgn_syntax::ast::{self, Item, UseSource};
use mgn_syntax::{Diagnostic, Span};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Import chains deeper than this are refused (it bounds the loader's recursion).
const MAX_IMPORT_DEPTH: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModId(pub usize);

/// What a name in a module's scope stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// Item `index` of module `module`; `span` is where the name was bound (definition or import).
    Item { module: ModId, index: usize, span: Span },
    /// A whole module, imported with `use std.nn` or `use "./x.mgn" as x`.
    Module { module: ModId, span: Span },
}

pub struct Module {
    /// `std.nn` or the file's display path.
    pub name: String,
    pub file: mgn_syntax::FileId,
    pub ast: ast::File,
    pub scope: HashMap<String, Binding>,
    /// Names whose definition or import failed (already reported): uses of them are not
    /// reported again.
    pub poisoned: Vec<String>,
}

impl Module {
    /// Index of the item defined here (not imported) under `name`.
    pub fn item_index(&self, name: &str) -> Option<usize> {
        self.ast.items.iter().position(|i| i.name().is_some_and(|n| n.name == name))
    }

    pub fn item_names(&self) -> impl Iterator<Item = &str> {
        self.ast.items.iter().filter_map(|i| i.name()).map(|n| n.name.as_str())
    }
}

pub struct Program {
    pub sources: SourceMap,
    pub modules: Vec<Module>,
    pub root: ModId,
    /// What every name in every module refers to (see `resolve`).
    pub resolution: Resolution,
}

impl Program {
    pub fn module(&self, id: ModId) -> &Module {
        &self.modules[id.0]
    }

    pub fn item(&self, module: ModId, index: usize) -> &Item {
        &self.modules[module.0].ast.items[index]
    }
}

/// Editor buffers that stand in for files on disk, by normalized path: an import of one of
/// these paths reads the buffer instead of the file (the language server's unsaved edits).
pub type Overrides = HashMap<PathBuf, String>;

struct Loader {
    sources: SourceMap,
    overrides: Overrides,
    modules: Vec<Module>,
    by_origin: HashMap<Origin, ModId>,
    /// Modules whose imports are being loaded, for cycle detection.
    stack: Vec<ModId>,
    diags: Vec<Diagnostic>,
}

/// Loads `text` (named `name`, from `origin`) and its imports.
pub fn load(name: String, origin: Origin, text: String) -> (Program, Vec<Diagnostic>) {
    load_with_overrides(name, origin, text, Overrides::new())
}

/// As `load`, with imported files read from `overrides` where present.
pub fn load_with_overrides(
    name: String,
    origin: Origin,
    text: String,
    overrides: Overrides,
) -> (Program, Vec<Diagnostic>) {
    let mut l = Loader {
        sources: SourceMap::new(),
        overrides,
        modules: Vec::new(),
        by_origin: HashMap::new(),
        stack: Vec::new(),
        diags: Vec::new(),
    };
    let root = l.load_module(name, origin, text);
    let mut program =
        Program { sources: l.sources, modules: l.modules, root, resolution: Resolution::default() };
    program.resolution = resolve(&program);
    (program, l.diags)
}

/// Loads a file from disk as the root of a program.
pub fn load_path(path: &Path) -> Result<(Program, Vec<Diagnostic>), String> {
    let text = read_source(path)
        .map_err(|reason| format!("cannot read `{}`: {reason}", path.display()))?;
    Ok(load(path.display().to_string(), Origin::Path(normalize(path)), text))
}

impl Loader {
    fn load_module(&mut self, name: String, origin: Origin, text: String) -> ModId {
        let file = self.sources.add(name.clone(), origin.clone(), text);
        let (ast, diags) = mgn_syntax::parse(file, &self.sources.get(file).text);
        self.diags.extend(diags);
        let id = ModId(self.modules.len());
        let poisoned = ast.unparsed.iter().map(|i| i.name.clone()).collect();
        self.modules.push(Module { name, file, ast, scope: HashMap::new(), poisoned });
        self.by_origin.insert(origin.clone(), id);

        self.stack.push(id);
        let uses: Vec<ast::UseItem> = self.modules[id.0]
            .ast
            .items
            .iter()
            .filter_map(|i| if let Item::Use(u) = i { Some(u.clone()) } else { None })
            .collect();
        let mut targets = Vec::new();
        for u in &uses {
            targets.push(self.import_target(&origin, u));
        }
        self.stack.pop();

        self.build_scope(id, &uses, &targets);
        id
    }

    /// Loads the module a `use` names. Returns it with the item named by a trailing path
    /// segment (`use std.loss.cross_entropy`), if any.
    fn import_target(
        &mut self,
        from: &Origin,
        u: &ast::UseItem,
    ) -> Option<(ModId, Option<ast::Ident>)> {
        match &u.source {
            UseSource::Path(path) => self.std_import(u, path),
            UseSource::File { path, span } => {
                let base = match from {
                    Origin::Path(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
                    Origin::Std(_) => {
                        self.diags.push(Diagnostic::error(
                            "E0104",
                            "the standard library cannot import files",
                            *span,
                            "here",
                        ));
                        return None;
                    }
                    Origin::Memory(_) => std::env::current_dir().unwrap_or_default(),
                };
                let full: PathBuf = normalize(&base.join(path));
                let display = full.display().to_string();
                let read_path = full.clone();
                let buffer = self.overrides.get(&full).cloned();
                let read = move || match buffer {
                    Some(text) => Ok(text),
                    None => read_source(&read_path),
                };
                let id = self.get_or_load(Origin::Path(full), display, read, *span)?;
                Some((id, None))
            }
        }
    }

    /// `use std.nn`, `use std.nn.{Linear}`, `use std.loss.cross_entropy`.
    fn std_import(
        &mut self,
        u: &ast::UseItem,
        path: &[ast::Ident],
    ) -> Option<(ModId, Option<ast::Ident>)> {
        let first = &path[0];
        if first.name != "std" {
            let mut d = Diagnostic::error(
                "E0102",
                format!("unknown module `{}`", first.name),
                first.span,
                "not a module",
            )
            .with_help(concat!(
                "modules are `std.<name>` (std.nn, std.attention, std.loss, std.init) ",
                "or a quoted file path such as \"./blocks.mgn\""
            ));
            if let Some(h) = did_you_mean(&first.name, ["std"]) {
                d = d.with_help(h);
            }
            self.diags.push(d);
            return None;
        }
        let Some(module) = path.get(1) else {
            self.diags.push(
                Diagnostic::error(
                    "E0102",
                    "`use std` needs a module name",
                    first.span,
                    "which module?",
                )
                .with_help(concat!(
                    "write `use std.nn.{Linear}` or another module: ",
                    "std.nn, std.attention, std.loss, std.init"
                )),
            );
            return None;
        };
        let Some((mname, text)) = std_source(&module.name) else {
            let mut d = Diagnostic::error(
                "E0102",
                format!("there is no module `std.{}`", module.name),
                module.span,
                "unknown module",
            );
            let names: Vec<&str> = STDLIB.iter().map(|(n, _)| *n).collect();
            d = d.with_help(match super::nearest(&module.name, names.iter().copied()) {
                Some(n) => format!("did you mean `std.{n}`?"),
                None => format!(
                    "the standard modules are {}",
                    names.iter().map(|n| format!("`std.{n}`")).collect::<Vec<_>>().join(", ")
                ),
            });
            self.diags.push(d);
            return None;
        };
        if path.len() > 3 || (path.len() == 3 && u.names.is_some()) {
            let extra = &path[if u.names.is_some() { 2 } else { 3 }];
            self.diags.push(Diagnostic::error(
                "E0102",
                format!("`std.{}` has no submodules", module.name),
                extra.span,
                "unexpected path segment",
            ));
            return None;
        }
        let origin = Origin::Std(mname);
        let id =
            self.get_or_load(origin, format!("std.{mname}"), || Ok(text.to_string()), module.span)?;
        Some((id, path.get(2).cloned()))
    }

    fn get_or_load(
        &mut self,
        origin: Origin,
        name: String,
        read: impl FnOnce() -> Result<String, String>,
        use_span: Span,
    ) -> Option<ModId> {
        if let Some(&id) = self.by_origin.get(&origin) {
            if let Some(pos) = self.stack.iter().position(|m| *m == id) {
                let mut chain: Vec<String> =
                    self.stack[pos..].iter().map(|m| self.modules[m.0].name.clone()).collect();
                chain.push(self.modules[id.0].name.clone());
                self.diags.push(
                    Diagnostic::error(
                        "E0105",
                        format!("import cycle: {}", chain.join(" → ")),
                        use_span,
                        "this import closes the cycle",
                    )
                    .with_help("move what both files need into a third file that imports neither"),
                );
                return None;
            }
            return Some(id);
        }
        if self.stack.len() >= MAX_IMPORT_DEPTH {
            self.diags.push(Diagnostic::error(
                "E0104",
                format!("imports are nested more than {MAX_IMPORT_DEPTH} files deep"),
                use_span,
                "this import is too deep",
            ));
            return None;
        }
        match read() {
            Ok(text) => Some(self.load_module(name, origin, text)),
            Err(reason) => {
                self.diags.push(Diagnostic::error(
                    "E0104",
                    format!("cannot import `{name}`: {reason}"),
                    use_span,
                    reason,
                ));
                None
            }
        }
    }

    fn build_scope(
        &mut self,
        id: ModId,
        uses: &[ast::UseItem],
        targets: &[Option<(ModId, Option<ast::Ident>)>],
    ) {
        let mut b = ScopeBuilder::default();
        for (index, item) in self.modules[id.0].ast.items.iter().enumerate() {
            if let Some(name) = item.name() {
                b.bind(name, Binding::Item { module: id, index, span: name.span });
            }
        }
        for (u, target) in uses.iter().zip(targets) {
            if let (Some(_), Some(alias)) = (&u.names, &u.alias) {
                b.diags.push(
                    Diagnostic::error(
                        "E0102",
                        "`as` after a list of names renames nothing",
                        alias.span,
                        "this alias has no effect",
                    )
                    .with_help("rename single names inside the braces: `use std.nn.{Linear as L}`"),
                );
            }
            let Some((target, single)) = target else {
                b.poison(u);
                continue;
            };
            let tmod = &self.modules[target.0];
            match (&u.names, single) {
                (Some(names), _) => {
                    for n in names {
                        b.import_item(*target, tmod, &n.name, n.alias.as_ref());
                    }
                }
                (None, Some(name)) => b.import_item(*target, tmod, name, u.alias.as_ref()),
                (None, None) => {
                    let local = match (&u.alias, &u.source) {
                        (Some(a), _) => a,
                        (None, UseSource::Path(p)) => p.last().expect("paths are non-empty"),
                        (None, UseSource::File { span, .. }) => {
                            b.diags.push(
                                Diagnostic::error(
                                    "E0104",
                                    "a file import needs a list of names or an alias",
                                    *span,
                                    "import what?",
                                )
                                .with_help(concat!(
                                    "write `use \"./blocks.mgn\".{Block}` ",
                                    "or `use \"./blocks.mgn\" as blocks`"
                                )),
                            );
                            continue;
                        }
                    };
                    b.bind(local, Binding::Module { module: *target, span: local.span });
                }
            }
        }
        self.diags.extend(b.diags);
        self.modules[id.0].scope = b.scope;
        self.modules[id.0].poisoned.extend(b.poisoned);
    }
}

/// A module's scope under construction, with what its imports reported.
#[derive(Default)]
struct ScopeBuilder {
    scope: HashMap<String, Binding>,
    diags: Vec<Diagnostic>,
    /// Names a failed import would have bound.
    poisoned: Vec<String>,
}

impl ScopeBuilder {
    fn bind(&mut self, name: &ast::Ident, b: Binding) {
        let Some(prev) = self.scope.get(&name.name) else {
            self.scope.insert(name.name.clone(), b);
            return;
        };
        let prev_span = match prev {
            Binding::Item { span, .. } | Binding::Module { span, .. } => *span,
        };
        self.diags.push(
            Diagnostic::error(
                "E0106",
                format!("`{}` is defined more than once", name.name),
                name.span,
                "defined again here",
            )
            .with_label(prev_span, "first defined here")
            .with_help("rename one of them, or import it under another name with `as`"),
        );
    }

    /// Imports item `name` of module `target` (which is `tmod`), under `alias` if given.
    fn import_item(
        &mut self,
        target: ModId,
        tmod: &Module,
        name: &ast::Ident,
        alias: Option<&ast::Ident>,
    ) {
        let local = alias.unwrap_or(name);
        if let Some(index) = tmod.item_index(&name.name) {
            self.bind(local, Binding::Item { module: target, index, span: local.span });
            return;
        }
        self.poisoned.push(local.name.clone());
        let mut d = Diagnostic::error(
            "E0103",
            format!("`{}` has no item named `{}`", tmod.name, name.name),
            name.span,
            "not found in this module",
        );
        if let Some(c) = super::nearest(&name.name, tmod.item_names()) {
            d = super::replace_with(d.with_help(format!("did you mean `{c}`?")), name.span, c);
        } else {
            let mut all: Vec<&str> = tmod.item_names().collect();
            all.sort();
            d = d.with_note(format!("`{}` defines: {}", tmod.name, all.join(", ")));
        }
        self.diags.push(d);
    }

    /// The import failed and was reported: the names it would have bound are not reported
    /// again where they are used.
    fn poison(&mut self, u: &ast::UseItem) {
        self.poisoned.extend(
            u.names.iter().flatten().map(|n| n.alias.as_ref().unwrap_or(&n.name).name.clone()),
        );
        match (&u.alias, &u.source) {
            (Some(a), _) => self.poisoned.push(a.name.clone()),
            (None, UseSource::Path(p)) if u.names.is_none() => {
                self.poisoned.push(p.last().expect("paths are non-empty").name.clone())
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Loads `text` as `dir/main.mgn` on another thread; `None` if it takes over 20 s.
    fn load_in(dir: &Path, text: &str) -> Option<Vec<Diagnostic>> {
        let (tx, rx) = mpsc::channel();
        let origin = Origin::Path(dir.join("main.mgn"));
        let text = text.to_string();
        std::thread::spawn(move || tx.send(load("main.mgn".into(), origin, text).1));
        rx.recv_timeout(Duration::from_secs(20)).ok()
    }

    /// A FIFO would block, a device would be read without end; bad UTF-8 is located.
    #[cfg(unix)]
    #[test]
    fn imports_of_special_files_and_bad_text_are_diagnostics_at_the_use() {
        let dir = std::env::temp_dir().join(format!("mgn-load-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let made = std::process::Command::new("mkfifo").arg(dir.join("fifo.mgn")).status();
        assert!(made.unwrap().success());
        std::fs::write(dir.join("bad.mgn"), b"layer A {}\n\xc3(").unwrap();
        let text = "use \"./fifo.mgn\".{A}\nuse \"/dev/zero\".{B}\nuse \"./bad.mgn\".{C}\n";
        let diags = load_in(&dir, text).expect("loading answers");
        let got: Vec<(&str, String, u32)> =
            diags.iter().map(|d| (d.code, d.message.clone(), d.primary_span().start)).collect();
        let fifo = dir.join("fifo.mgn").display().to_string();
        let bad = dir.join("bad.mgn").display().to_string();
        let want = [
            (
                "E0104",
                format!("cannot import `{fifo}`: it is a named pipe (FIFO), not a regular file"),
                4,
            ),
            (
                "E0104",
                "cannot import `/dev/zero`: it is a character device, not a regular file".into(),
                25,
            ),
            (
                "E0104",
                format!(
                    "cannot import `{bad}`: the file is not valid UTF-8: byte 0xC3 at offset 11 \
                     (line 2, column 1)"
                ),
                45,
            ),
        ];
        assert_eq!(got, want);
    }
}
