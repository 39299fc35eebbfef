//! The dependency table: for each kind of change a snapshot carries, which generated types it can
//! alter, for which views, and whether it can alter a view's resolution or a connected proxy's
//! identity. The generation cache (what a new snapshot's generation carries over, patches, or
//! hands over untouched), view resolution and the sessions ask it; none of them decides on its
//! own: the per-view narrowing of its rows (`routing`: which views read an edited VirtualService
//! or DestinationRule; `endpoints`: which views have clusters of a host) lives here too. A
//! generator that starts reading something new needs its row here, or connected proxies keep
//! stale config: `tests/staleness_oracle.rs` compares them with a fresh server to catch it.

mod effects;
mod endpoints;
mod resolutions;
mod routing;
mod table;

pub use effects::ChangeEffects;
pub use endpoints::has_clusters_of;
pub use resolutions::KeptResolutions;
pub use routing::{changed_types, RoutingEdit};
pub use table::may_change_identities;
