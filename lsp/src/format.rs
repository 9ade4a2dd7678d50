//! `textDocument/formatting`: the one place the server calls the formatter.

/// Formats a whole document with the same formatter as `mgnc fmt`. A file with syntax errors
/// is not formatted; the error says why (the diagnostics themselves are already published).
pub fn format_document(text: &str) -> Result<String, String> {
    mgn_syntax::format::format(text).map_err(|diags| match diags.first() {
        Some(d) => format!("cannot format a file with errors: {}", d.message),
        None => "cannot format this file".to_string(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_like_mgnc_fmt_and_refuses_broken_files() {
        let out = super::format_document("fn f(x:f32[4])->f32[4]{relu( x )}").expect("formats");
        assert_eq!(
            out,
            mgn_syntax::format::format("fn f(x:f32[4])->f32[4]{relu( x )}").expect("formats")
        );
        assert!(out.contains("relu(x)"), "{out}");
        assert!(super::format_document("fn f(")
            .unwrap_err()
            .starts_with("cannot format a file with errors"));
    }
}
