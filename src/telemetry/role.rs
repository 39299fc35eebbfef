//! What a process is: the role its telemetry names.

/// What a process is; its telemetry carries this as `meshpilot.role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Ingest and a frontend in one process.
    Standalone,
    /// An ingest node (builds snapshots; serves them while leader).
    Ingest,
    /// An xDS frontend following the leader.
    Frontend,
    /// A command-line tool (`validate`, `load`, `version`): logs only, nothing exported.
    Tool,
}

impl Role {
    /// The `meshpilot.role` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Standalone => "standalone",
            Role::Ingest => "ingest",
            Role::Frontend => "frontend",
            Role::Tool => "tool",
        }
    }
}
