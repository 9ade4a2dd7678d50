//! Document URIs, file paths and compiler origins, and the on-disk copy of the standard library
//! that definitions into `std.*` point at.
//!
//! The stdlib is embedded in the compiler. So that "go to definition" on `Linear` works in
//! every editor without client-side code, the server writes the embedded modules once to a
//! cache directory (`$MGN_STDLIB_DIR`, else `$XDG_CACHE_HOME/mgn/stdlib-<hash>`, else
//! `~/.cache/mgn/stdlib-<hash>`, else the temp directory) as read-only files and answers with
//! `file://` URIs into it. A document opened from there is analysed as the stdlib module itself.

use lsp_types::Uri;
use mgn_compiler::source::{normalize, Origin, STDLIB};
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub fn path_to_uri(path: &Path) -> Option<Uri> {
    let mut s = path.to_string_lossy().replace('\\', "/");
    if !s.starts_with('/') {
        s.insert(0, '/'); // `C:/x` on Windows
    }
    let mut out = String::from("file://");
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Uri::from_str(&out).ok()
}

/// The path of a `file:` URI.
pub fn uri_to_path(uri: &Uri) -> Option<PathBuf> {
    let s = uri.as_str();
    let rest = s.strip_prefix("file://")?;
    // Skip an authority (`file://host/path`; usually empty).
    let path = &rest[rest.find('/')?..];
    let path = path.split(['?', '#']).next().unwrap_or(path);
    let decoded = percent_decode(path)?;
    // `/c:/x` is a Windows drive path.
    let b = decoded.as_bytes();
    if cfg!(windows) && b.len() >= 3 && b[0] == b'/' && b[1].is_ascii_alphabetic() && b[2] == b':' {
        return Some(PathBuf::from(&decoded[1..]));
    }
    Some(PathBuf::from(decoded))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Where the stdlib copy lives and how origins map to URIs.
pub struct Paths {
    std_dir: Option<PathBuf>,
}

impl Paths {
    /// Writes the stdlib copy (if it is not there already) and remembers where it is.
    pub fn new() -> Paths {
        Paths { std_dir: write_stdlib() }
    }

    /// No stdlib copy: definitions into the stdlib have no location (tests).
    #[cfg(test)]
    pub fn without_stdlib() -> Paths {
        Paths { std_dir: None }
    }

    /// The compiler origin a document URI stands for.
    pub fn origin(&self, uri: &Uri) -> Origin {
        match uri_to_path(uri) {
            Some(path) => {
                let path = normalize(&path);
                if let (Some(dir), Some(parent), Some(stem)) =
                    (&self.std_dir, path.parent(), path.file_stem())
                {
                    if parent == dir.as_path() && path.extension().is_some_and(|e| e == "mgn") {
                        if let Some((name, _)) =
                            STDLIB.iter().find(|(n, _)| **n == *stem.to_string_lossy())
                        {
                            return Origin::Std(name);
                        }
                    }
                }
                Origin::Path(path)
            }
            None => Origin::Memory(uri.as_str().to_string()),
        }
    }

    /// The URI of a file the compiler loaded.
    pub fn uri(&self, origin: &Origin) -> Option<Uri> {
        match origin {
            Origin::Path(p) => {
                let p =
                    if p.is_absolute() { p.clone() } else { std::env::current_dir().ok()?.join(p) };
                path_to_uri(&p)
            }
            Origin::Std(name) => path_to_uri(&self.std_dir.as_ref()?.join(format!("{name}.mgn"))),
            Origin::Memory(s) => Uri::from_str(s).ok(),
        }
    }
}

impl Default for Paths {
    fn default() -> Paths {
        Paths::new()
    }
}

fn fnv(data: &[u8], mut h: u64) -> u64 {
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn write_stdlib() -> Option<PathBuf> {
    let mut h = 0xcbf29ce484222325;
    for (name, text) in STDLIB {
        h = fnv(name.as_bytes(), h);
        h = fnv(text.as_bytes(), h);
    }
    let dir = match std::env::var_os("MGN_STDLIB_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME")
                        .filter(|d| !d.is_empty())
                        .map(|h| PathBuf::from(h).join(".cache"))
                })
                .unwrap_or_else(std::env::temp_dir);
            cache.join("mgn").join(format!("stdlib-{h:016x}"))
        }
    };
    let try_write = |dir: &Path| -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for (name, text) in STDLIB {
            let path = dir.join(format!("{name}.mgn"));
            // Not `read_to_string`: a FIFO or a device there must not block or fill the memory.
            if mgn_compiler::source::read_source(&path).ok().as_deref() == Some(*text) {
                continue;
            }
            // Write beside and rename, so a concurrent server never reads half a file.
            let tmp = dir.join(format!(".{name}.mgn.{}", std::process::id()));
            if let Ok(meta) = std::fs::metadata(&path) {
                let mut perms = meta.permissions();
                #[allow(clippy::permissions_set_readonly_false)]
                perms.set_readonly(false);
                let _ = std::fs::set_permissions(&path, perms);
            }
            std::fs::write(&tmp, text)?;
            let mut perms = std::fs::metadata(&tmp)?.permissions();
            perms.set_readonly(true);
            std::fs::set_permissions(&tmp, perms)?;
            std::fs::rename(&tmp, &path)?;
        }
        Ok(())
    };
    let dir = if dir.is_absolute() { dir } else { std::env::current_dir().ok()?.join(dir) };
    let dir = normalize(&dir);
    match try_write(&dir) {
        Ok(()) => Some(dir),
        Err(e) => {
            eprintln!("mgn-lsp: cannot write the stdlib copy to {}: {e}", dir.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_round_trip() {
        let p = Path::new("/tmp/a dir/ü.mgn");
        let uri = path_to_uri(p).unwrap();
        assert_eq!(uri.as_str(), "file:///tmp/a%20dir/%C3%BC.mgn");
        assert_eq!(uri_to_path(&uri).unwrap(), p);
        let vscode = Uri::from_str("file:///tmp/x%3Ay.mgn").unwrap();
        assert_eq!(uri_to_path(&vscode).unwrap(), Path::new("/tmp/x:y.mgn"));
        assert!(uri_to_path(&Uri::from_str("untitled:Untitled-1").unwrap()).is_none());
    }
}
