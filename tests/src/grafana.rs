//! The shipped Grafana dashboard's queries as Grafana sends them to Prometheus.
//!
//! ```text
//!   deploy/monitoring/grafana-dashboard.json ──panels()──► per panel (rows flattened): its title and the
//!        (or the ConfigMap the install makes of it)         PromQL of each visible target, template
//!                                                          variables substituted for a time range
//!                                                          ──► Prometheus::query_range, step $__interval
//! ```
//!
//! Grafana's substitution, as far as these dashboards use it: `$__interval` is the time range divided by
//! the panel's data points (`maxDataPoints`, default 1000), at least the panel's `interval` or else the
//! datasource's scrape interval; `$__rate_interval` is max(`$__interval` + scrape interval, 4 × scrape
//! interval); `$__range` is the time range. (Grafana also rounds `$__interval` to a "nice" value; for a
//! range of minutes the scrape interval dominates, so that is left out.) A datasource variable is
//! resolved by the panel's datasource, which must be Prometheus. Any other variable is an error naming the
//! panel: the test would otherwise send Prometheus a query no Grafana sends.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::prometheus::{duration_text, parse_duration};

/// What Grafana knows when it renders the dashboard.
#[derive(Clone, Copy, Debug)]
pub struct TimeRange {
    /// The dashboard's time range (from − to).
    pub range: Duration,
    /// The datasource's scrape interval (its "Scrape interval" setting, Grafana's `timeInterval`).
    pub scrape_interval: Duration,
}

/// One target of a panel, ready to send.
#[derive(Clone, Debug, PartialEq)]
pub struct Query {
    pub ref_id: String,
    pub expr: String,
    /// The query step (`$__interval`).
    pub step: Duration,
    /// An instant query (the target's `instant: true`) rather than a range query.
    pub instant: bool,
}

/// A panel and its queries.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub title: String,
    pub kind: String,
    pub queries: Vec<Query>,
}

/// Every panel of `dashboard` (rows' panels included, rows themselves left out) with its queries for
/// `time`, or an error naming the panel and what Grafana would not send.
pub fn panels(dashboard: &Value, time: TimeRange) -> Result<Vec<Panel>> {
    let datasource_vars: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "datasource")
        .map(|v| {
            if v["query"] != "prometheus" {
                bail!(
                    "templating variable {}: a datasource of type {} (only prometheus is queried here)",
                    v["name"],
                    v["query"]
                );
            }
            v["name"].as_str().context("a templating variable without a name")
        })
        .collect::<Result<_>>()?;
    let mut flat = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        if p["type"] == "row" {
            flat.extend(p["panels"].as_array().into_iter().flatten());
        } else {
            flat.push(p);
        }
    }
    flat.into_iter()
        .map(|p| {
            let title = p["title"].as_str().unwrap_or("(untitled)").to_string();
            panel(p, &datasource_vars, time).with_context(|| format!("panel {title:?}"))
        })
        .collect()
}

fn panel(p: &Value, datasource_vars: &[&str], time: TimeRange) -> Result<Panel> {
    check_datasource(&p["datasource"], datasource_vars)?;
    let min = match p["interval"].as_str() {
        Some(i) if !i.is_empty() => parse_duration(i.trim_start_matches('>'))?,
        _ => time.scrape_interval,
    };
    let points = p["maxDataPoints"].as_u64().unwrap_or(1000).max(1) as u32;
    let interval = (time.range / points).max(min);
    let rate_interval = (interval + time.scrape_interval).max(time.scrape_interval * 4);
    let mut queries = Vec::new();
    for t in p["targets"].as_array().into_iter().flatten() {
        if t["hide"] == true {
            continue;
        }
        let ref_id = t["refId"].as_str().unwrap_or_default().to_string();
        if !t["datasource"].is_null() {
            check_datasource(&t["datasource"], datasource_vars)
                .with_context(|| format!("target {ref_id}"))?;
        }
        let expr = t["expr"]
            .as_str()
            .with_context(|| format!("target {ref_id} has no expr"))?;
        let expr = substitute(expr, interval, rate_interval, time.range)
            .with_context(|| format!("target {ref_id}"))?;
        queries.push(Query {
            ref_id,
            expr,
            step: interval,
            instant: t["instant"] == true,
        });
    }
    if queries.is_empty() {
        bail!("no query to run");
    }
    Ok(Panel {
        title: p["title"].as_str().unwrap_or_default().to_string(),
        kind: p["type"].as_str().unwrap_or_default().to_string(),
        queries,
    })
}

/// A panel's or target's datasource: Prometheus, by a datasource variable or directly.
fn check_datasource(ds: &Value, vars: &[&str]) -> Result<()> {
    if ds["type"] != "prometheus" {
        bail!("datasource {ds} is not Prometheus");
    }
    let uid = ds["uid"].as_str().unwrap_or_default();
    if let Some(var) = uid
        .strip_prefix("${")
        .and_then(|u| u.strip_suffix('}'))
        .or_else(|| uid.strip_prefix('$'))
        && !vars.contains(&var)
    {
        bail!("datasource uid {uid} names no datasource variable of the dashboard");
    }
    Ok(())
}

/// `expr` with Grafana's interval and range variables replaced; any other variable is an error.
pub fn substitute(
    expr: &str,
    interval: Duration,
    rate_interval: Duration,
    range: Duration,
) -> Result<String> {
    let values = [
        ("__rate_interval", duration_text(rate_interval)),
        ("__interval_ms", interval.as_millis().to_string()),
        ("__interval", duration_text(interval)),
        ("__range_ms", range.as_millis().to_string()),
        ("__range_s", range.as_secs().to_string()),
        ("__range", duration_text(range)),
    ];
    if expr.contains("[[") {
        bail!("{expr:?}: [[variable]] syntax is not substituted here");
    }
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced
                    .find('}')
                    .with_context(|| format!("{expr:?}: unclosed ${{"))?;
                (&braced[..end], end + 2)
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        // `$1` is label_replace's capture group, not a variable (Grafana leaves it too).
        if !name.is_empty() && name.chars().all(|c| c.is_ascii_digit()) {
            out.push('$');
            rest = after;
            continue;
        }
        let value = values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .with_context(|| {
                format!("{expr:?}: variable ${name} is not one Grafana defines here")
            })?;
        out.push_str(value);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const S30: Duration = Duration::from_secs(30);

    #[test]
    fn interval_variables_are_substituted_as_grafana_does() {
        let range = Duration::from_secs(180);
        let cases = [
            ("rate(x[$__rate_interval])", "rate(x[120s])"),
            ("rate(x[${__rate_interval}])", "rate(x[120s])"),
            ("avg_over_time(x[$__interval])", "avg_over_time(x[30s])"),
            (
                "increase(x[$__range]) / $__range_s",
                "increase(x[180s]) / 180",
            ),
            ("x", "x"),
            (
                r#"label_replace(x, "a", "$1", "b", "(.*)")"#,
                r#"label_replace(x, "a", "$1", "b", "(.*)")"#,
            ),
        ];
        for (expr, want) in cases {
            assert_eq!(substitute(expr, S30, S30 * 4, range).unwrap(), want);
        }
        let err = format!(
            "{:#}",
            substitute("x{job=\"$job\"}", S30, S30, range).unwrap_err()
        );
        assert!(
            err.contains("variable $job is not one Grafana defines"),
            "{err}"
        );
    }

    #[test]
    fn panels_flatten_rows_and_resolve_the_datasource_variable() {
        let ds = json!({"type": "prometheus", "uid": "${datasource}"});
        let d = json!({
            "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
            "panels": [
                {"type": "row", "title": "r", "panels": [
                    {"type": "stat", "title": "a", "datasource": ds, "targets": [{"refId": "A", "expr": "up"}]}
                ]},
                {"type": "timeseries", "title": "b", "datasource": ds, "targets": [
                    {"refId": "A", "expr": "rate(x[$__rate_interval])"},
                    {"refId": "B", "expr": "hidden", "hide": true}
                ]}
            ]
        });
        let time = TimeRange {
            range: Duration::from_secs(600),
            scrape_interval: Duration::from_secs(15),
        };
        let p = panels(&d, time).unwrap();
        assert_eq!(
            p.iter().map(|p| p.title.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        // 600 s / 1000 points is below the scrape interval: $__interval is 15 s, the rate window 60 s.
        assert_eq!(p[1].queries.len(), 1);
        assert_eq!(p[1].queries[0].expr, "rate(x[60s])");
        assert_eq!(p[1].queries[0].step, Duration::from_secs(15));

        let mut other = d.clone();
        other["panels"][1]["datasource"] = json!({"type": "loki", "uid": "x"});
        let err = format!("{:#}", panels(&other, time).unwrap_err());
        assert!(
            err.contains("panel \"b\"") && err.contains("not Prometheus"),
            "{err}"
        );
    }

    #[test]
    fn the_shipped_dashboard_has_queries_for_every_panel() {
        let path = crate::fleet::workspace_root().join("deploy/monitoring/grafana-dashboard.json");
        let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let p = panels(
            &d,
            TimeRange {
                range: Duration::from_secs(300),
                scrape_interval: S30,
            },
        )
        .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        assert!(p.len() >= 10, "{p:?}");
    }
}
