//! Where a generated line came from. Every statement carries the ONNX nodes it stands for as
//! data beside its text, so structure recovery compares text alone (two blocks are equal when
//! their code is, whatever nodes made it) and the comment naming the nodes is written last:
//! `let shape = reshape(x, [batch, 3, 4])  // onnx: /Reshape, /Shape, /Gather +2 more`.
//!
//! A line is annotated only where its mapping is not obvious. Obvious is a line made by one
//! node that reads as that node: a builtin with the op's name (`Relu` → `relu(…)`, `ReduceMean`
//! → `mean(…)`, `Conv` → `conv2d(…)`), an operator for an arithmetic or comparison op (`Add` →
//! `+`), or a std layer call whose parameters keep the initializers' names. Everything else
//! names its nodes: a line that fuses several (attention, GELU, a `Linear` from `MatMul` +
//! `Add`), one that reads a constant folded from nodes (a reshape whose shape came from
//! `Shape` → `Gather` → `Concat`), and an op written as another construct (`Expand` →
//! `broadcast_to`, `Transpose` → `permute`, `Pow` by 2 → `square`).

/// The most node names a comment lists before "+N more".
const SHOWN: usize = 3;

/// One statement of a forward.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stmt {
    /// The code, without any comment.
    pub text: String,
    /// The module path of the node the statement came from (empty at the top).
    pub scope: String,
    /// The ONNX nodes the comment names, the one whose value the statement binds first; empty
    /// where the text says which node it is.
    pub nodes: Vec<String>,
}

impl Stmt {
    /// A statement that names no node (a call of a recovered layer, an `output`).
    pub fn plain(text: String, scope: &str) -> Stmt {
        Stmt { text, scope: scope.to_string(), nodes: Vec::new() }
    }

    /// The comment naming the statement's nodes, if it names any.
    pub fn comment(&self) -> Option<String> {
        if self.nodes.is_empty() {
            return None;
        }
        let shown = self.nodes.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
        let more = self.nodes.len().saturating_sub(SHOWN);
        let more = if more > 0 { format!(" +{more} more") } else { String::new() };
        Some(format!("// onnx: {shown}{more}"))
    }

    /// The statement as written at `indent` spaces, ending in a newline: the code with the
    /// comment after it where both fit in the formatter's width, else the comment on a line
    /// of its own above (a statement too long for one line is broken by the formatter, and a
    /// comment after it would follow its closing bracket).
    pub fn render(&self, indent: usize) -> String {
        let pad = " ".repeat(indent);
        match self.comment() {
            None => format!("{pad}{}\n", self.text),
            Some(c) if indent + self.text.chars().count() + 2 + c.chars().count() <= WIDTH => {
                format!("{pad}{}  {c}\n", self.text)
            }
            Some(c) => format!("{pad}{c}\n{pad}{}\n", self.text),
        }
    }
}

/// The formatter's line width (`mgn_syntax::format::MAX_WIDTH`).
const WIDTH: usize = 100;

/// A node's name as a comment shows it: on one line, or its op and index where it has none.
pub fn label(name: &str, op: &str, index: usize) -> String {
    let name: String =
        name.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>();
    let name = name.trim();
    if name.is_empty() {
        format!("{op} #{index}")
    } else {
        name.to_string()
    }
}

/// The operators an op is written as beyond the translator's binary ones
/// (`ops::pointwise::BINARY`): products and unary operators.
const OPERATORS: &[(&str, &str)] =
    &[("MatMul", "@"), ("Mod", "%"), ("Neg", "unary -"), ("Not", "unary !")];

/// Whether `text`, made from one node of type `op`, reads as that node: every construct it
/// uses (the functions it calls, its operators; literals made with `full` aside) is the op's
/// own. `layer` says a call of a std layer counts as the op's (the claim kept the file's
/// initializer names).
pub fn reads_as(op: &str, text: &str, layer: bool) -> bool {
    let Some(rhs) = rhs(text) else { return true };
    let own = |c: &Construct| match c {
        Construct::Layer => layer,
        Construct::Op(sym) => (super::ops::pointwise::BINARY.iter().chain(OPERATORS))
            .any(|(o, s)| *o == op && s == sym),
        Construct::Call(f) => f == "full" || same_name(op, f),
    };
    constructs(rhs).iter().all(own)
}

/// The right-hand side of a `let`; `None` for other statements (`output`).
fn rhs(text: &str) -> Option<&str> {
    let rest = text.strip_prefix("let ")?;
    let at = if rest.starts_with('(') { rest.find(") = ")? + 1 } else { rest.find(" = ")? };
    Some(&rest[at + 3..])
}

/// `ReduceMean` and `mean`, `MaxPool` and `max_pool2d`, `Conv` and `conv2d` name the same
/// thing: case, underscores, a `Reduce` prefix and a `1d`/`2d`/`3d` suffix aside.
fn same_name(op: &str, f: &str) -> bool {
    let norm = |s: &str| -> String {
        let s: String = s.chars().filter(|c| *c != '_').collect::<String>().to_ascii_lowercase();
        let s = s.strip_prefix("reduce").filter(|r| !r.is_empty()).unwrap_or(&s).to_string();
        match s.strip_suffix('d') {
            Some(r) if r.ends_with(['1', '2', '3']) => r[..r.len() - 1].to_string(),
            _ => s,
        }
    };
    norm(op) == norm(f)
}

#[derive(Debug, PartialEq)]
enum Construct {
    /// A function or builtin called by name.
    Call(String),
    /// A binary operator, or `unary -` / `unary !`.
    Op(String),
    /// A field called as a layer (`self.conv1(x)`, `self.layers[0](x)`).
    Layer,
}

/// What an expression the importer wrote is made of. The importer writes spaces around every
/// binary operator and none after a unary one, so tokens between spaces tell them apart.
/// Operators inside a list (`[batch * 12, 64]`) compute sizes, not tensors: they are the
/// node's shape, not a construct of their own.
fn constructs(e: &str) -> Vec<Construct> {
    let b = e.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut in_str, mut in_list) = (0, false, 0usize);
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let c = b[i];
        if c == b'"' {
            in_str = !in_str;
            i += 1;
            continue;
        }
        if in_str {
            i += 1;
            continue;
        }
        match c {
            b'[' => in_list += 1,
            b']' => in_list = in_list.saturating_sub(1),
            _ => {}
        }
        // An operator stands between spaces; a unary one opens an operand.
        if c == b' ' && in_list > 0 {
            i += 1;
            continue;
        }
        if c == b' ' {
            let end = e[i + 1..].find(' ').map_or(b.len(), |k| i + 1 + k);
            let tok = &e[i + 1..end];
            let binary = ["+", "-", "*", "/", "@", "%", "==", "!=", "<", ">", "<=", ">=", "&&"];
            if (binary.contains(&tok) || tok == "||") && end < b.len() {
                out.push(Construct::Op(tok.to_string()));
                i = end;
                continue;
            }
            i += 1;
            continue;
        }
        // `x^T` is the transpose of the last two axes.
        if e[i..].starts_with("^T") {
            out.push(Construct::Call("transpose".into()));
            i += 2;
            continue;
        }
        let opens = i == 0 || matches!(b[i - 1], b' ' | b'(' | b'[' | b',');
        if opens
            && (c == b'-' || c == b'!')
            && b.get(i + 1).is_some_and(|&n| n != b'=' && n != b' ')
        {
            let number = b.get(i + 1).is_some_and(|n| n.is_ascii_digit());
            if !number {
                out.push(Construct::Op(format!("unary {}", c as char)));
            }
            i += 1;
            continue;
        }
        if (c.is_ascii_alphabetic() || c == b'_') && (i == 0 || !word(b[i - 1]) && b[i - 1] != b'.')
        {
            let start = i;
            while i < b.len() && word(b[i]) {
                i += 1;
            }
            let name = &e[start..i];
            if name == "self" {
                // A field access, maybe called: `self.a.b[2](x)`.
                while i < b.len() && (word(b[i]) || matches!(b[i], b'.' | b'[' | b']')) {
                    i += 1;
                }
                if b.get(i) == Some(&b'(') {
                    out.push(Construct::Layer);
                }
            } else if b.get(i) == Some(&b'(') {
                out.push(Construct::Call(name.to_string()));
            }
            continue;
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_reads_as_its_node_only_in_the_ops_own_words() {
        assert!(reads_as("Relu", "let r = relu(x)", false));
        assert!(reads_as("Add", "let a = x + y", false));
        assert!(reads_as("Add", "let a = x + full([1], 2.0, dtype = f32)", false));
        assert!(reads_as("ReduceMean", "let m = mean(x, axis = 2, keepdim = true)", false));
        assert!(reads_as("Conv", "let c = conv2d(x, self.w, stride = 2)", false));
        assert!(reads_as("MaxPool", "let p = max_pool2d(x, 3)", false));
        assert!(reads_as("Neg", "let n = -x", false));
        assert!(reads_as("Slice", "let s = slice(x, 3, -32, 64)", false));
        assert!(reads_as("Reshape", "let r = reshape(x, [batch * 12, (sequence - 0)])", false));
        assert!(reads_as("Conv", "let c = self.layer1[0].conv1(x)", true));
        assert!(!reads_as("Conv", "let c = self.layer1[0].conv1(x)", false));
        assert!(!reads_as("Expand", "let e = broadcast_to(x, [2, 3])", false));
        assert!(!reads_as("Transpose", "let t = permute(x, [1, 0])", false));
        assert!(reads_as("Transpose", "let t = self.lm_head.weight^T", false));
        assert!(!reads_as("MatMul", "let t = x @ w^T", false));
        assert!(!reads_as("Pow", "let p = square(x)", false));
        assert!(!reads_as("Reciprocal", "let r = 1.0 / x", false));
        assert!(!reads_as("Sub", "let s = x + y", false));
        assert!(!reads_as("Gather", "let i = where(ids < 0, ids + 9, ids)", false));
        assert!(!reads_as(
            "Softmax",
            "let s = reshape(softmax(reshape(x, [6, 4])), [2, 3, 4])",
            false
        ));
        assert!(reads_as("Split", "let (a, b) = split(x, [2, 2], axis = 1)", false));
        assert!(reads_as("Einsum", "let e = einsum(\"ij,jk -> ik\", a, b)", false));
        assert!(reads_as("Anything", "output y", false));
    }

    #[test]
    fn a_comment_names_three_nodes_then_counts_the_rest() {
        let nodes = ["/a/Reshape", "/a/Shape", "/a/Gather", "/a/Unsqueeze", "/a/Concat"];
        let s = Stmt {
            text: "let r = reshape(x, [2, 3])".into(),
            scope: "a".into(),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            s.render(4),
            "    let r = reshape(x, [2, 3])  // onnx: /a/Reshape, /a/Shape, /a/Gather +2 more\n"
        );
        // Where the two do not fit on one line, the comment goes above.
        assert_eq!(
            s.render(40),
            format!(
                "{0}// onnx: /a/Reshape, /a/Shape, /a/Gather +2 more\n{0}{1}\n",
                " ".repeat(40),
                s.text
            )
        );
        assert_eq!(Stmt::plain("output y".into(), "").render(0), "output y\n");
        assert_eq!(label("", "Mul", 7), "Mul #7");
        assert_eq!(label("a\nb", "Mul", 7), "a b");
    }
}
