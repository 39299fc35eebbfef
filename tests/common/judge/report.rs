//! What the judge found: per case and type, resources agreeing / declared / differing / only in
//! one server; a readable diff of each disagreement; the markdown and JSON report; and the
//! baseline ratchet (resources that agreed may only go on agreeing).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use meshpilot::admin::envoy_json::bytes_to_json_lenient;
use meshpilot::sim::HeldResource;
use meshpilot::xds::TypeUrl;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::case::Case;
use super::compare::{differences, short, Difference};
use super::declared::DeclaredSet;
use super::normalise::normalise;
use super::run::ProxyResult;
use crate::common::oracle::line_diff;

/// Differences kept per resource in reports.
const DIFFERENCES_PER_RESOURCE: usize = 12;
/// Lines of line diff kept per resource.
const DIFF_LINES: usize = 30;
/// Resources larger than this (lines of JSON) get no line diff: the field list says it.
const LINE_DIFF_MAX_LINES: usize = 1500;

/// Resources by verdict, for one type.
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counts {
    /// Equal after normalisation.
    pub agree: usize,
    /// Every difference declared.
    pub declared: usize,
    /// Some difference not declared.
    pub differ: usize,
    /// Sent by istiod only.
    pub only_istiod: usize,
    /// Sent by meshpilot only.
    pub only_meshpilot: usize,
}

impl Counts {
    /// All resources either server sent.
    pub fn total(&self) -> usize {
        self.agree + self.declared + self.differ + self.only_istiod + self.only_meshpilot
    }

    fn add(&mut self, other: &Counts) {
        self.agree += other.agree;
        self.declared += other.declared;
        self.differ += other.differ;
        self.only_istiod += other.only_istiod;
        self.only_meshpilot += other.only_meshpilot;
    }
}

/// One resource that does not agree.
#[derive(Debug, Clone, Serialize)]
pub struct Disagreement {
    /// `proxy/name`.
    pub resource: String,
    /// CDS, EDS, LDS, RDS, SDS.
    #[serde(rename = "type")]
    pub type_name: String,
    /// `declared`, `differ`, `only-istiod`, `only-meshpilot`.
    pub verdict: String,
    /// The fields that differ (at most [`DIFFERENCES_PER_RESOURCE`]).
    pub differences: Vec<Difference>,
    /// How many more differ.
    pub more: usize,
    /// Declared reasons that applied.
    pub reasons: Vec<String>,
    /// A line diff of the two (normalised) resources, capped.
    pub line_diff: Option<String>,
}

/// How often one kind of difference (type and generic field path) occurs, with an example.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Tally {
    /// Resources showing it.
    pub resources: usize,
    /// One resource and its values.
    pub example: String,
}

/// One case's findings.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// `corpus/name`.
    pub name: String,
    /// The corpus.
    pub corpus: String,
    /// The proxies asked (`name.namespace`).
    pub proxies: Vec<String>,
    /// Inputs left out, and why.
    pub skipped: Vec<String>,
    /// Why the case could not be judged, if it could not.
    pub error: Option<String>,
    /// By type.
    pub counts: BTreeMap<String, Counts>,
    /// The agreeing resources (`proxy/name`) by type: what the baseline records.
    pub agreeing: BTreeMap<String, BTreeSet<String>>,
    /// Difference kinds (`TYPE path`) seen.
    pub kinds: BTreeMap<String, Tally>,
    /// The resources that do not agree.
    pub disagreements: Vec<Disagreement>,
}

fn decode(type_url: TypeUrl, r: &HeldResource) -> Value {
    let name = type_url.as_str().trim_start_matches("type.googleapis.com/");
    let raw = match &r.bytes {
        Some(bytes) => {
            bytes_to_json_lenient(name, bytes).unwrap_or_else(|e| Value::String(format!("undecodable: {e}")))
        }
        None => Value::Null,
    };
    normalise(raw)
}

fn short_value(v: &Option<Value>) -> String {
    let text = match v {
        Some(v) => serde_json::to_string(v).unwrap_or_default(),
        None => "(absent)".into(),
    };
    if text.len() > 160 {
        format!("{}…", &text[..text.char_indices().nth(160).map(|(i, _)| i).unwrap_or(text.len())])
    } else {
        text
    }
}

/// Judges `results` of `case` (None: `error` says why it could not run).
pub fn judge_case(case: &Case, results: Result<&[ProxyResult], String>, declared: &DeclaredSet) -> CaseReport {
    let mut report = CaseReport {
        name: case.name.clone(),
        corpus: case.corpus.clone(),
        proxies: case.proxies.iter().map(|p| p.key()).collect(),
        skipped: case.skipped.clone(),
        error: None,
        counts: BTreeMap::new(),
        agreeing: BTreeMap::new(),
        kinds: BTreeMap::new(),
        disagreements: Vec::new(),
    };
    let results = match results {
        Ok(r) => r,
        Err(e) => {
            report.error = Some(e);
            return report;
        }
    };
    for result in results {
        let types: BTreeSet<TypeUrl> = result.istiod.keys().chain(result.meshpilot.keys()).copied().collect();
        for type_url in types {
            let t = short(type_url).to_string();
            let empty = BTreeMap::new();
            let a = result.istiod.get(&type_url).unwrap_or(&empty);
            let b = result.meshpilot.get(&type_url).unwrap_or(&empty);
            let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for name in names {
                let resource = format!("{}/{name}", result.proxy.key());
                let counts = report.counts.entry(t.clone()).or_default();
                let (x, y) = (a.get(name).map(|r| decode(type_url, r)), b.get(name).map(|r| decode(type_url, r)));
                let (verdict, diffs, reasons) = match (&x, &y) {
                    (Some(x), Some(y)) => {
                        let diffs = differences(x, y);
                        if diffs.is_empty() {
                            counts.agree += 1;
                            report.agreeing.entry(t.clone()).or_default().insert(resource);
                            continue;
                        }
                        let reasons: Vec<Option<&str>> =
                            diffs.iter().map(|d| declared.reason(&case.name, &t, name, d)).collect();
                        if reasons.iter().all(Option::is_some) {
                            counts.declared += 1;
                            let reasons: BTreeSet<String> = reasons.into_iter().flatten().map(String::from).collect();
                            ("declared", diffs, reasons.into_iter().collect())
                        } else {
                            counts.differ += 1;
                            let undeclared =
                                diffs.into_iter().zip(reasons).filter(|(_, r)| r.is_none()).map(|(d, _)| d).collect();
                            ("differ", undeclared, Vec::new())
                        }
                    }
                    (Some(_), None) => {
                        counts.only_istiod += 1;
                        ("only-istiod", Vec::new(), Vec::new())
                    }
                    _ => {
                        counts.only_meshpilot += 1;
                        ("only-meshpilot", Vec::new(), Vec::new())
                    }
                };
                if verdict == "differ" {
                    let kinds: BTreeSet<String> = diffs.iter().map(|d| format!("{t} {}", d.kind())).collect();
                    for kind in kinds {
                        let tally = report.kinds.entry(kind.clone()).or_default();
                        tally.resources += 1;
                        if tally.example.is_empty() {
                            let d = diffs
                                .iter()
                                .find(|d| format!("{t} {}", d.kind()) == kind)
                                .expect("the kind's difference");
                            tally.example = format!(
                                "{resource} {}: istiod {} / meshpilot {}",
                                d.path,
                                short_value(&d.istiod),
                                short_value(&d.meshpilot)
                            );
                        }
                    }
                } else if verdict.starts_with("only") {
                    let tally = report.kinds.entry(format!("{t} ({verdict})")).or_default();
                    tally.resources += 1;
                    if tally.example.is_empty() {
                        tally.example = resource.clone();
                    }
                }
                let line_diff = match (&x, &y) {
                    (Some(x), Some(y)) => {
                        let (x, y) = (pretty(x), pretty(y));
                        (x.lines().count() <= LINE_DIFF_MAX_LINES && y.lines().count() <= LINE_DIFF_MAX_LINES)
                            .then(|| cap_lines(&line_diff(&x, &y), DIFF_LINES))
                    }
                    _ => None,
                };
                let more = diffs.len().saturating_sub(DIFFERENCES_PER_RESOURCE);
                report.disagreements.push(Disagreement {
                    resource,
                    type_name: t.clone(),
                    verdict: verdict.into(),
                    differences: diffs.into_iter().take(DIFFERENCES_PER_RESOURCE).collect(),
                    more,
                    reasons,
                    line_diff,
                });
            }
        }
    }
    report
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

fn cap_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= n {
        return text.to_string();
    }
    format!("{}\n    … {} more lines", lines[..n].join("\n"), lines.len() - n)
}

/// A readable account of one disagreement: its fields, then its line diff.
pub fn describe(d: &Disagreement) -> String {
    let mut out = format!("{} {} ({})\n", d.type_name, d.resource, d.verdict);
    for diff in &d.differences {
        let _ = writeln!(
            out,
            "  {}: istiod {} | meshpilot {}",
            diff.path,
            short_value(&diff.istiod),
            short_value(&diff.meshpilot)
        );
    }
    if d.more > 0 {
        let _ = writeln!(out, "  … and {} more fields", d.more);
    }
    for r in &d.reasons {
        let _ = writeln!(out, "  declared: {r}");
    }
    if let Some(ld) = &d.line_diff {
        let _ = writeln!(out, "  lines that differ (- istiod, + meshpilot):\n{ld}");
    }
    out
}

/// The baseline: agreeing resources by case and type.
pub type Baseline = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// Where the baseline is committed.
pub fn baseline_path() -> std::path::PathBuf {
    super::case::hand_made_dir().join("baseline.json")
}

/// The committed baseline (empty where there is none yet).
pub fn read_baseline() -> Baseline {
    match std::fs::read_to_string(baseline_path()) {
        Ok(text) => serde_json::from_str(&text).expect("baseline.json: agreeing resources by case and type"),
        Err(_) => Baseline::new(),
    }
}

/// `baseline` with the agreements of `reports` in place of their cases' entries, written back.
pub fn write_baseline(mut baseline: Baseline, reports: &[CaseReport]) {
    for r in reports.iter().filter(|r| r.error.is_none()) {
        baseline.insert(r.name.clone(), r.agreeing.clone());
    }
    let text = serde_json::to_string_pretty(&baseline).expect("baseline JSON");
    std::fs::write(baseline_path(), text + "\n").expect("writing baseline.json");
}

/// The ratchet: (regressions — resources the baseline has agreeing that no longer agree, each
/// with its diff; new agreements the baseline lacks).
pub fn ratchet(baseline: &Baseline, reports: &[CaseReport]) -> (Vec<String>, Vec<String>) {
    let (mut regressions, mut gains) = (Vec::new(), Vec::new());
    for r in reports {
        let Some(base) = baseline.get(&r.name) else {
            if r.agreeing.values().any(|s| !s.is_empty()) {
                gains.push(format!("{}: a case the baseline does not have yet", r.name));
            }
            continue;
        };
        if let Some(e) = &r.error {
            regressions.push(format!("{}: could not be judged: {e}", r.name));
            continue;
        }
        for (t, names) in base {
            let now = r.agreeing.get(t);
            for name in names.iter().filter(|n| !now.is_some_and(|s| s.contains(*n))) {
                let detail = r
                    .disagreements
                    .iter()
                    .find(|d| &d.type_name == t && &d.resource == name)
                    .map(describe)
                    .unwrap_or_else(|| format!("{t} {name}: sent by neither server now\n"));
                regressions.push(format!("{}: agreed in the baseline, now:\n{detail}", r.name));
            }
        }
        for (t, names) in &r.agreeing {
            let before = base.get(t);
            gains.extend(
                names.iter().filter(|n| !before.is_some_and(|s| s.contains(*n))).map(|n| format!("{} {t} {n}", r.name)),
            );
        }
    }
    (regressions, gains)
}

fn pct(c: &Counts) -> String {
    match c.total() {
        0 => "–".into(),
        t => format!("{}/{} ({:.0}%)", c.agree, t, 100.0 * c.agree as f64 / t as f64),
    }
}

fn row(label: &str, t: &str, c: &Counts) -> String {
    format!(
        "| {label} | {t} | {} | {} | {} | {} | {} |\n",
        pct(c),
        c.declared,
        c.differ,
        c.only_istiod,
        c.only_meshpilot
    )
}

/// The agreement table by corpus and type (with totals), as markdown.
pub fn summary_table(reports: &[CaseReport]) -> String {
    let mut by: BTreeMap<(String, String), Counts> = BTreeMap::new();
    let mut all: BTreeMap<String, Counts> = BTreeMap::new();
    for r in reports {
        for (t, c) in &r.counts {
            by.entry((r.corpus.clone(), t.clone())).or_default().add(c);
            all.entry(t.clone()).or_default().add(c);
        }
    }
    let mut out = String::from(
        "| corpus | type | agree / total | declared | differ | only istiod | only meshpilot |\n|---|---|---|---|---|---|---|\n",
    );
    for ((corpus, t), c) in &by {
        out.push_str(&row(corpus, t, c));
    }
    let mut total = Counts::default();
    for (t, c) in &all {
        out.push_str(&row("**all**", t, c));
        total.add(c);
    }
    out.push_str(&row("**all**", "**all**", &total));
    out
}

/// The most common difference kinds over all cases: (kind, resources, example).
pub fn top_kinds(reports: &[CaseReport], n: usize) -> Vec<(String, usize, String)> {
    let mut all: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for r in reports {
        for (k, t) in &r.kinds {
            let e = all.entry(k.clone()).or_insert((0, t.example.clone()));
            e.0 += t.resources;
        }
    }
    let mut v: Vec<(String, usize, String)> = all.into_iter().map(|(k, (c, e))| (k, c, e)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(n);
    v
}

/// The markdown report: tables, the most common differences, skipped inputs, and diffs trimmed
/// to `diffs_per_case` disagreements per case.
pub fn markdown(reports: &[CaseReport], header: &str, diffs_per_case: usize) -> String {
    let mut out = String::from(header);
    out.push_str("\n## Agreement by corpus and type\n\n");
    out.push_str(&summary_table(reports));
    out.push_str("\n## By case\n\n| case | proxies | CDS | EDS | LDS | RDS | note |\n|---|---|---|---|---|---|---|\n");
    for r in reports {
        let cell = |t: &str| r.counts.get(t).map(pct).unwrap_or_else(|| "–".into());
        let note = match (&r.error, r.skipped.len()) {
            (Some(e), _) => format!("not judged: {}", e.lines().next().unwrap_or("")),
            (None, 0) => String::new(),
            (None, n) => format!("{n} input(s) skipped"),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            r.proxies.len(),
            cell("CDS"),
            cell("EDS"),
            cell("LDS"),
            cell("RDS"),
            note.replace('|', "\\|")
        );
    }
    out.push_str("\n## Most common differences\n\nResources showing each kind of difference (type and field path, list positions as `*`), with one example.\n\n| kind | resources | example |\n|---|---|---|\n");
    for (k, c, e) in top_kinds(reports, 25) {
        let _ = writeln!(out, "| `{}` | {c} | {} |", k.replace('|', "\\|"), e.replace('|', "\\|").replace('`', "'"));
    }
    out.push_str("\n## Inputs skipped\n\n");
    for r in reports.iter().filter(|r| !r.skipped.is_empty()) {
        let _ = writeln!(out, "- {}: {}", r.name, r.skipped.join("; "));
    }
    out.push_str(
        "\n## Diffs\n\nPer case, up to a few disagreeing resources that show a kind of difference no case above \
         showed yet (report.json has every case's first disagreements field by field).\n",
    );
    let mut shown: BTreeSet<String> = BTreeSet::new();
    for r in reports.iter().filter(|r| !r.disagreements.is_empty()) {
        let fresh: Vec<&Disagreement> = r
            .disagreements
            .iter()
            .filter(|d| {
                let new = kinds_of(d).into_iter().filter(|k| !shown.contains(k)).collect::<Vec<_>>();
                let any = !new.is_empty();
                shown.extend(new);
                any
            })
            .take(diffs_per_case)
            .collect();
        let _ = writeln!(out, "\n### {}\n\n{} disagreeing resources.", r.name, r.disagreements.len());
        if fresh.is_empty() {
            continue;
        }
        out.push_str("\n```\n");
        for d in fresh {
            out.push_str(&describe(d));
        }
        out.push_str("```\n");
    }
    out
}

/// The difference kinds one disagreement shows.
fn kinds_of(d: &Disagreement) -> Vec<String> {
    match d.verdict.as_str() {
        "differ" | "declared" => d.differences.iter().map(|x| format!("{} {}", d.type_name, x.kind())).collect(),
        v => vec![format!("{} ({v})", d.type_name)],
    }
}

/// The JSON report: every case's counts and agreeing resources in full; its `per_case` most
/// common difference kinds and first `per_case` disagreements with their fields (values cut to a readable length, no line
/// diff), so the file stays a size one reads and commits.
pub fn json_report(reports: &[CaseReport], per_case: usize) -> Value {
    let cases: Vec<Value> = reports
        .iter()
        .map(|r| {
            let disagreements: Vec<Value> = r
                .disagreements
                .iter()
                .take(per_case)
                .map(|d| {
                    let fields: Vec<Value> = d
                        .differences
                        .iter()
                        .map(|x| {
                            serde_json::json!({"path": x.path, "istiod": short_value(&x.istiod), "meshpilot": short_value(&x.meshpilot)})
                        })
                        .collect();
                    serde_json::json!({"type": d.type_name, "resource": d.resource, "verdict": d.verdict,
                        "differences": fields, "more_fields": d.more, "reasons": d.reasons})
                })
                .collect();
            serde_json::json!({
                "name": r.name, "corpus": r.corpus, "proxies": r.proxies, "skipped": r.skipped, "error": r.error,
                "counts": r.counts, "agreeing": r.agreeing, "kinds": top_case_kinds(r, per_case),
                "disagreements": disagreements,
                "disagreements_left_off": r.disagreements.len().saturating_sub(per_case),
            })
        })
        .collect();
    Value::Array(cases)
}

/// The `n` difference kinds of `r` shown by the most resources.
fn top_case_kinds(r: &CaseReport, n: usize) -> BTreeMap<String, Tally> {
    let mut kinds: Vec<(&String, &Tally)> = r.kinds.iter().collect();
    kinds.sort_by(|a, b| b.1.resources.cmp(&a.1.resources).then(a.0.cmp(b.0)));
    kinds.into_iter().take(n).map(|(k, t)| (k.clone(), t.clone())).collect()
}
