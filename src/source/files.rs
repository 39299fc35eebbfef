//! Reading config files from a directory tree (YAML and JSON), for the directory source and `validate`.

use std::path::{Path, PathBuf};

use crate::config::parse::{parse_file, Document};

/// Whether a path names a config file meshpilot reads.
pub fn is_config_file(path: &Path) -> bool {
    let hidden = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'));
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
    !hidden && matches!(ext, "yaml" | "yml" | "json")
}

/// Lists config files under `root` (or `root` itself if it is a file), sorted, skipping hidden
/// directories (editors and Kubernetes ConfigMap mounts keep `..data` style copies there).
pub fn list_config_files(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    if root.is_file() {
        return Ok(vec![root.to_path_buf()]);
    }
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let hidden = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'));
            if path.is_dir() {
                if !hidden {
                    dirs.push(path);
                }
            } else if is_config_file(&path) {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Parses every config file under `root`; an unreadable file yields one invalid document.
pub fn parse_tree(root: &Path) -> std::io::Result<Vec<(PathBuf, Vec<Document>)>> {
    Ok(list_config_files(root)?
        .into_iter()
        .map(|path| {
            let shown = path.display().to_string();
            let docs = match std::fs::read_to_string(&path) {
                Ok(text) => parse_file(&shown, &text),
                Err(e) => vec![Document::Invalid(crate::config::ConfigError {
                    file: shown,
                    document: 0,
                    object: None,
                    error: crate::config::FieldError::new("", format!("cannot read file: {e}")),
                })],
            };
            (path, docs)
        })
        .collect())
}
