//! `exportTo` semantics: which namespaces may see an object.

use serde::Serialize;

/// Where an object (service, VirtualService, DestinationRule) is visible.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub enum Visibility {
    /// `*`: every namespace.
    Public,
    /// Only listed namespaces (`.` already resolved to the owner's namespace); empty with `~` means none.
    Namespaces(Vec<String>),
}

impl Visibility {
    /// Resolves an `exportTo` list for an object in `owner_ns`, using `default` when the list is empty.
    pub fn from_export_to(export_to: &[String], owner_ns: &str, default: &[String]) -> Visibility {
        let list = if export_to.is_empty() { default } else { export_to };
        if list.is_empty() || list.iter().any(|e| e == "*") {
            return Visibility::Public;
        }
        let mut namespaces: Vec<String> = list
            .iter()
            .filter(|e| e.as_str() != "~")
            .map(|e| if e == "." { owner_ns.to_string() } else { e.clone() })
            .collect();
        namespaces.sort();
        namespaces.dedup();
        Visibility::Namespaces(namespaces)
    }

    /// Whether a proxy in `namespace` can see the object.
    pub fn visible_to(&self, namespace: &str) -> bool {
        match self {
            Visibility::Public => true,
            Visibility::Namespaces(list) => list.iter().any(|n| n == namespace),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_to_rules() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(Visibility::from_export_to(&[], "a", &s(&["*"])), Visibility::Public);
        let private = Visibility::from_export_to(&s(&["."]), "a", &s(&["*"]));
        assert!(private.visible_to("a") && !private.visible_to("b"));
        let none = Visibility::from_export_to(&s(&["~"]), "a", &s(&["*"]));
        assert!(!none.visible_to("a"));
        let listed = Visibility::from_export_to(&s(&[".", "b"]), "a", &s(&["*"]));
        assert!(listed.visible_to("a") && listed.visible_to("b") && !listed.visible_to("c"));
    }
}
