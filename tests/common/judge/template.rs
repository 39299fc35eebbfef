//! The few Go-template constructs Istio's benchmark inputs (`pilot/pkg/xds/testdata/benchmarks`)
//! use: `range $i := until .Services` … `end`, `$i`, `div`/`mod` of variables, numbers and
//! `.Services`/`.Instances`. Anything else is refused (the case is skipped, saying why).

use std::collections::BTreeMap;

/// The template's parameters: how many services and instances (small: the judge compares what
/// two servers make of each kind of input, not how they scale).
pub fn parameters() -> BTreeMap<String, i64> {
    [("Services".to_string(), 3), ("Instances".to_string(), 4)].into_iter().collect()
}

enum Node {
    Text(String),
    Expr(String),
    Range { var: String, count: String, body: Vec<Node> },
}

/// Renders `text` with `params`; `Err` names the construct it does not know.
pub fn render(text: &str, params: &BTreeMap<String, i64>) -> Result<String, String> {
    let mut tokens = tokenize(text)?.into_iter();
    let nodes = parse(&mut tokens, false)?;
    let mut out = String::new();
    emit(&nodes, params, &mut BTreeMap::new(), &mut out)?;
    Ok(out)
}

enum Token {
    Text(String),
    Action(String),
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let mut before = rest[..start].to_string();
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or("an unclosed {{")?;
        let mut action = &after[..end];
        if let Some(a) = action.strip_prefix('-') {
            before = before.trim_end().to_string();
            action = a;
        }
        let mut trim_next = false;
        if let Some(a) = action.strip_suffix('-') {
            action = a;
            trim_next = true;
        }
        tokens.push(Token::Text(before));
        tokens.push(Token::Action(action.trim().to_string()));
        rest = &after[end + 2..];
        if trim_next {
            rest = rest.trim_start();
        }
    }
    tokens.push(Token::Text(rest.to_string()));
    Ok(tokens)
}

fn parse(tokens: &mut impl Iterator<Item = Token>, in_range: bool) -> Result<Vec<Node>, String> {
    let mut nodes = Vec::new();
    while let Some(token) = tokens.next() {
        match token {
            Token::Text(t) => nodes.push(Node::Text(t)),
            Token::Action(a) if a == "end" => {
                return if in_range { Ok(nodes) } else { Err("an `end` without `range`".into()) };
            }
            Token::Action(a) if a.starts_with("range ") => {
                let words: Vec<&str> = a.split_whitespace().collect();
                let [_, var, ":=", "until", count] = words.as_slice() else {
                    return Err(format!("unsupported range `{a}`"));
                };
                let body = parse(tokens, true)?;
                nodes.push(Node::Range { var: var.to_string(), count: count.to_string(), body });
            }
            Token::Action(a) => nodes.push(Node::Expr(a)),
        }
    }
    if in_range {
        return Err("a `range` without `end`".into());
    }
    Ok(nodes)
}

fn value(word: &str, params: &BTreeMap<String, i64>, vars: &BTreeMap<String, i64>) -> Result<i64, String> {
    if let Some(p) = word.strip_prefix("$.").or_else(|| word.strip_prefix('.')) {
        return params.get(p).copied().ok_or_else(|| format!("unknown parameter `{word}`"));
    }
    if word.starts_with('$') {
        return vars.get(word).copied().ok_or_else(|| format!("unknown variable `{word}`"));
    }
    word.parse().map_err(|_| format!("unsupported operand `{word}`"))
}

fn emit(
    nodes: &[Node],
    params: &BTreeMap<String, i64>,
    vars: &mut BTreeMap<String, i64>,
    out: &mut String,
) -> Result<(), String> {
    for node in nodes {
        match node {
            Node::Text(t) => out.push_str(t),
            Node::Expr(e) => {
                let words: Vec<&str> = e.split_whitespace().collect();
                let n = match words.as_slice() {
                    [w] => value(w, params, vars)?,
                    [op @ ("div" | "mod"), a, b] => {
                        let (a, b) = (value(a, params, vars)?, value(b, params, vars)?);
                        if b == 0 {
                            return Err(format!("`{e}` divides by zero"));
                        }
                        if *op == "div" {
                            a / b
                        } else {
                            a % b
                        }
                    }
                    _ => return Err(format!("unsupported expression `{e}`")),
                };
                out.push_str(&n.to_string());
            }
            Node::Range { var, count, body } => {
                let n = value(count, params, vars)?;
                for i in 0..n {
                    vars.insert(var.clone(), i);
                    // Every range in these inputs repeats whole documents, and some bodies end
                    // without a separator (`knative-gateway.yaml`): each iteration starts a new
                    // document (empty documents are dropped).
                    out.push_str("\n---\n");
                    emit(body, params, vars, out)?;
                }
                vars.remove(var);
            }
        }
    }
    Ok(())
}
