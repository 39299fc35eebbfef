//! `meshpilot_heap_allocated_bytes`: the bytes the process's live allocations hold, as the
//! [`allocator`](crate::allocator) counts them (istiod's counterpart is
//! `go_memstats_heap_alloc_bytes`). Its gap to the resident set is what the allocator keeps.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::IntGauge;

use super::metrics::{gauge_value, invalid_name};
use crate::allocator::allocated_bytes;

/// `meshpilot_heap_allocated_bytes`, read at each scrape; absent where nothing counts.
#[derive(Clone, Debug)]
pub struct HeapCollector {
    gauge: IntGauge,
}

impl HeapCollector {
    /// The collector (register it once per registry).
    pub fn new() -> HeapCollector {
        const NAME: &str = "meshpilot_heap_allocated_bytes";
        let help = "Bytes held by live heap allocations (the resident set less what the allocator keeps unused).";
        HeapCollector { gauge: IntGauge::new(NAME, help).unwrap_or_else(|_| invalid_name(NAME)) }
    }
}

impl Default for HeapCollector {
    fn default() -> Self {
        HeapCollector::new()
    }
}

impl Collector for HeapCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        match allocated_bytes() {
            Some(bytes) => {
                self.gauge.set(gauge_value(bytes));
                self.gauge.collect()
            }
            None => Vec::new(),
        }
    }
}
