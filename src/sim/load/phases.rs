//! The phases file: after the initial convergence, each phase changes something (writes config
//! files, or POSTs to a URL such as the replay server's `/phase/<name>`) and the run measures the
//! push that follows.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use serde::Deserialize;

use crate::sim::capture::INITIAL_PHASE;

/// `{"phases": [...]}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseFile {
    /// In the order they run.
    pub phases: Vec<Phase>,
}

/// One phase.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    /// Its name in the report and the capture.
    pub name: String,
    /// A URL to POST (2xx required) before the phase's clock starts: a benchmark samples the
    /// servers there, and that time is not the push's.
    #[serde(default)]
    pub prepare: Option<String>,
    /// What starts it.
    pub action: Action,
}

impl Phase {
    /// POSTs to `prepare`, if given.
    pub async fn prepare(&self) -> Result<(), PhaseError> {
        match &self.prepare {
            Some(url) => post(url).await,
            None => Ok(()),
        }
    }
}

/// What a phase does at its start: the writes first, then the POST.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// Files to replace (atomically: a temp file in the same directory renamed over the path).
    #[serde(default)]
    pub write: Vec<FileWrite>,
    /// URL to POST with an empty body; a 2xx answer is required.
    #[serde(default)]
    pub post: Option<String>,
}

/// One file write.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWrite {
    /// Absolute path.
    pub path: PathBuf,
    /// The new content.
    pub content: String,
}

/// Why a phases file is unusable or a phase's action failed.
#[derive(Debug, thiserror::Error)]
pub enum PhaseError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not a phases file.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: serde_json::Error,
    },
    /// A phase is not usable as written.
    #[error("phase {name:?}: {why}")]
    Invalid {
        /// The phase.
        name: String,
        /// What is wrong.
        why: &'static str,
    },
    /// Writing a file failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The POST failed or was not answered 2xx.
    #[error("POST {url}: {why}")]
    Post {
        /// The URL.
        url: String,
        /// What went wrong.
        why: String,
    },
}

impl PhaseFile {
    /// Reads and checks a phases file.
    pub fn read(path: &Path) -> Result<PhaseFile, PhaseError> {
        let text = std::fs::read(path).map_err(|source| PhaseError::Read { path: path.to_path_buf(), source })?;
        PhaseFile::parse(&text).map_err(|e| match e {
            PhaseError::Parse { source, .. } => PhaseError::Parse { path: path.to_path_buf(), source },
            other => other,
        })
    }

    /// Parses and checks the JSON text of a phases file.
    pub fn parse(text: &[u8]) -> Result<PhaseFile, PhaseError> {
        let file: PhaseFile =
            serde_json::from_slice(text).map_err(|source| PhaseError::Parse { path: PathBuf::new(), source })?;
        for (i, p) in file.phases.iter().enumerate() {
            let invalid = |why| Err(PhaseError::Invalid { name: p.name.clone(), why });
            if p.name.is_empty() || p.name == INITIAL_PHASE {
                return invalid("a phase needs a name other than \"initial\"");
            }
            if file.phases[..i].iter().any(|q| q.name == p.name) {
                return invalid("two phases have this name");
            }
            if p.action.write.is_empty() && p.action.post.is_none() {
                return invalid("the action neither writes nor posts");
            }
            if p.action.write.iter().any(|w| !w.path.is_absolute() || w.path.file_name().is_none()) {
                return invalid("write paths must be absolute file paths");
            }
        }
        Ok(file)
    }
}

impl Action {
    /// Performs the action.
    pub async fn perform(&self) -> Result<(), PhaseError> {
        for w in &self.write {
            write_atomically(&w.path, w.content.as_bytes())?;
        }
        if let Some(url) = &self.post {
            post(url).await?;
        }
        Ok(())
    }
}

/// Writes a temp file beside `path` and renames it over `path`, so a watcher never reads half a file.
fn write_atomically(path: &Path, content: &[u8]) -> Result<(), PhaseError> {
    let error = |source| PhaseError::Write { path: path.to_path_buf(), source };
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    // A leading dot: config watchers skip hidden files, so the temp file is never read as config.
    let temp = path.with_file_name(format!(".{name}.meshpilot-load-{}", std::process::id()));
    std::fs::write(&temp, content).map_err(error)?;
    std::fs::rename(&temp, path).map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        error(e)
    })
}

/// POSTs an empty body to an `http://host:port/path` URL over HTTP/1.1.
async fn post(url: &str) -> Result<(), PhaseError> {
    let fail = |why: String| PhaseError::Post { url: url.to_string(), why };
    let uri: hyper::Uri = url.parse().map_err(|e| fail(format!("bad URL: {e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(fail("only http:// URLs are supported".into()));
    }
    let host = uri.host().ok_or_else(|| fail("no host".into()))?.to_string();
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await.map_err(|e| fail(e.to_string()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| fail(e.to_string()))?;
    let connection = tokio::spawn(conn);
    let authority = uri.authority().map(|a| a.to_string()).unwrap_or(host);
    let request = hyper::Request::post(uri)
        .header(hyper::header::HOST, authority)
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(e.to_string()))?;
    let result = async {
        let response = sender.send_request(request).await.map_err(|e| fail(e.to_string()))?;
        let status = response.status();
        let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        if status.is_success() {
            Ok(())
        } else {
            Err(fail(format!("answered {status}: {}", String::from_utf8_lossy(&body).trim())))
        }
    }
    .await;
    connection.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_actions() {
        let text = br#"{"phases": [
            {"name": "vs-edit", "action": {"write": [{"path": "/tmp/x/vs.yaml", "content": "a: b"}]}},
            {"name": "ep-change", "prepare": "http://127.0.0.1:1/prepare/ep-change",
             "action": {"post": "http://127.0.0.1:1/phase/ep-change"}}]}"#;
        let f = PhaseFile::parse(text).expect("valid");
        assert_eq!(f.phases.len(), 2);
        assert_eq!(
            (f.phases[0].prepare.as_deref(), f.phases[1].prepare.as_deref()),
            (None, Some("http://127.0.0.1:1/prepare/ep-change"))
        );
        assert_eq!(f.phases[0].action.write[0].path, PathBuf::from("/tmp/x/vs.yaml"));
        assert_eq!(f.phases[1].action.post.as_deref(), Some("http://127.0.0.1:1/phase/ep-change"));
    }

    #[test]
    fn refuses_unusable_phases() {
        let bad = |text: &str| PhaseFile::parse(text.as_bytes()).expect_err(text).to_string();
        assert!(bad(r#"{"phases": [{"name": "initial", "action": {"post": "http://a/"}}]}"#).contains("initial"));
        assert!(bad(r#"{"phases": [{"name": "a", "action": {}}]}"#).contains("neither"));
        assert!(bad(r#"{"phases": [{"name": "a", "action": {"write": [{"path": "rel.yaml", "content": ""}]}}]}"#)
            .contains("absolute"));
        let twice = r#"{"phases": [{"name": "a", "action": {"post": "http://a/"}}, {"name": "a", "action": {"post": "http://a/"}}]}"#;
        assert!(bad(twice).contains("two phases"));
        assert!(bad(r#"{"phases": [{"name": "a", "action": {"delete": "x"}}]}"#).contains("unknown field"));
        assert!(bad("not json").contains("expected"));
    }

    #[test]
    fn writes_replace_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("vs.yaml");
        std::fs::write(&path, "old").expect("write");
        write_atomically(&path, b"new").expect("replace");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "new");
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1, "no temp file left");
    }

    #[tokio::test]
    async fn a_post_to_nothing_is_an_error() {
        let err = post("http://127.0.0.1:1/phase/x").await.expect_err("nothing listens on port 1");
        assert!(err.to_string().contains("POST http://127.0.0.1:1/phase/x"), "{err}");
    }
}
