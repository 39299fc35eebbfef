//! Differences meshpilot makes on purpose, declared in one file
//! (`tests/testdata/differential/declared.yaml`) with their reason. A resource whose every
//! difference is declared counts as "declared", never as agreeing.

use regex::Regex;
use serde::Deserialize;

use super::compare::Difference;

/// One declared difference.
#[derive(Debug, Deserialize)]
pub struct Declared {
    /// A regular expression the whole case name matches (absent: every case).
    #[serde(default)]
    pub case: Option<String>,
    /// CDS, EDS, LDS, RDS or SDS (`*`: any).
    #[serde(rename = "type")]
    pub type_name: String,
    /// A regular expression the whole resource name matches.
    pub name: String,
    /// A path prefix, `/`-separated; `*` matches any one part (a list position or name).
    pub path: String,
    /// Why meshpilot differs there.
    pub reason: String,
}

/// The declared differences, compiled.
pub struct DeclaredSet {
    entries: Vec<Entry>,
}

/// A declared difference with its regular expressions compiled.
struct Entry {
    declared: Declared,
    name: Regex,
    case: Option<Regex>,
}

fn whole(pattern: &str) -> Regex {
    Regex::new(&format!("^(?:{pattern})$")).unwrap_or_else(|e| panic!("declared.yaml: {pattern:?}: {e}"))
}

impl DeclaredSet {
    /// Reads `tests/testdata/differential/declared.yaml`.
    pub fn load() -> DeclaredSet {
        let path = super::case::hand_made_dir().join("declared.yaml");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        Self::parse(&text, &path.display().to_string())
    }

    /// The declared differences of YAML `text` (`place` names it in messages).
    pub fn parse(text: &str, place: &str) -> DeclaredSet {
        let entries: Vec<Declared> =
            serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{place}: not a list of declared differences: {e}"));
        let entries = entries
            .into_iter()
            .map(|d| {
                assert!(!d.reason.trim().is_empty(), "declared.yaml: {} {} has no reason", d.type_name, d.path);
                Entry { name: whole(&d.name), case: d.case.as_deref().map(whole), declared: d }
            })
            .collect();
        DeclaredSet { entries }
    }

    /// The reason declaring `difference` of resource `name` of type `type_name`, if any.
    pub fn reason(&self, case: &str, type_name: &str, name: &str, difference: &Difference) -> Option<&str> {
        let parts: Vec<&str> = difference.path.split('/').collect();
        self.entries
            .iter()
            .find(|e| {
                let d = &e.declared;
                (d.type_name == "*" || d.type_name == type_name)
                    && e.case.as_ref().is_none_or(|c| c.is_match(case))
                    && e.name.is_match(name)
                    && prefix_matches(&d.path, &parts)
            })
            .map(|e| e.declared.reason.as_str())
    }
}

fn prefix_matches(pattern: &str, parts: &[&str]) -> bool {
    let pattern: Vec<&str> = pattern.split('/').collect();
    pattern.len() <= parts.len() && pattern.iter().zip(parts).all(|(p, x)| *p == "*" || p == x)
}
