//! Profiles from a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1)
//! file: scheduler names, enabled/disabled plugins per extension point,
//! plugin args, percentageOfNodesToScore.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::framework::{Framework, Plugin, ScorePluginEntry};
use crate::plugins::{registry, FactoryContext, DEFAULT_PLUGINS};

pub const EXTENSION_POINTS: &[&str] = &[
    "queueSort",
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "score",
    "reserve",
    "permit",
    "preBind",
    "bind",
    "postBind",
];

/// The parsed configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub percentage_of_nodes_to_score: Option<i32>,
    pub profiles: Vec<Value>,
    /// `leaderElection.leaderElect`, when the file says.
    pub leader_elect: Option<bool>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            percentage_of_nodes_to_score: None,
            profiles: vec![json!({"schedulerName": crate::DEFAULT_SCHEDULER_NAME})],
            leader_elect: None,
        }
    }
}

fn percentage(v: Option<&Value>, what: &str) -> Result<Option<i32>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let p = v
                .as_i64()
                .with_context(|| format!("{what}: percentageOfNodesToScore must be an integer"))?;
            if !(0..=100).contains(&p) {
                bail!("{what}: percentageOfNodesToScore must be in 0..=100, got {p}");
            }
            Ok(if p == 0 { None } else { Some(p as i32) })
        }
    }
}

impl Config {
    /// Parses YAML or JSON text.
    pub fn parse(text: &str) -> Result<Config> {
        let v: Value =
            serde_yaml_ng::from_str(text).context("parsing the scheduler configuration")?;
        if !v.is_object() {
            bail!("the scheduler configuration must be an object");
        }
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind != "KubeSchedulerConfiguration" {
            bail!("kind must be KubeSchedulerConfiguration, got {kind:?}");
        }
        let api = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if !api.starts_with("kubescheduler.config.k8s.io/") {
            bail!("apiVersion must be kubescheduler.config.k8s.io/v1, got {api:?}");
        }
        let pct = percentage(v.get("percentageOfNodesToScore"), "configuration")?;
        let profiles = match v.get("profiles") {
            None | Some(Value::Null) => Config::default().profiles,
            Some(Value::Array(a)) if a.is_empty() => Config::default().profiles,
            Some(Value::Array(a)) => a.clone(),
            Some(_) => bail!("profiles must be a list"),
        };
        let leader_elect = match v.get("leaderElection") {
            None | Some(Value::Null) => None,
            Some(Value::Object(le)) => match le.get("leaderElect") {
                None | Some(Value::Null) => None,
                Some(Value::Bool(b)) => Some(*b),
                Some(other) => bail!("leaderElection.leaderElect must be a boolean, got {other}"),
            },
            Some(_) => bail!("leaderElection must be an object"),
        };
        Ok(Config {
            percentage_of_nodes_to_score: pct,
            profiles,
            leader_elect,
        })
    }

    pub fn load(path: &std::path::Path) -> Result<Config> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Config::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Builds one framework per profile.
    pub fn build(&self, ctx: &FactoryContext) -> Result<Vec<Arc<Framework>>> {
        let mut names = HashSet::new();
        let mut out = Vec::new();
        for (i, p) in self.profiles.iter().enumerate() {
            let fw = build_profile(p, self.percentage_of_nodes_to_score, ctx)
                .with_context(|| format!("profiles[{i}]"))?;
            if !names.insert(fw.scheduler_name.clone()) {
                bail!(
                    "duplicate profile with schedulerName {:?}",
                    fw.scheduler_name
                );
            }
            out.push(Arc::new(fw));
        }
        // One queue: every profile must sort it the same way.
        let sorts: HashSet<&str> = out
            .iter()
            .filter_map(|f| f.queue_sort.as_ref().map(|p| p.name()))
            .collect();
        if sorts.len() > 1 {
            bail!("all profiles must use the same queueSort plugin");
        }
        Ok(out)
    }
}

fn plugin_names(v: Option<&Value>) -> Result<Vec<(String, Option<i64>)>> {
    let mut out = Vec::new();
    for p in v.and_then(Value::as_array).into_iter().flatten() {
        let name = p
            .get("name")
            .and_then(Value::as_str)
            .context("plugins need a name")?;
        let weight = p.get("weight").and_then(Value::as_i64).filter(|w| *w != 0);
        if let Some(w) = weight {
            if w < 0 {
                bail!("plugin {name}: weight must be positive");
            }
        }
        out.push((name.to_string(), weight));
    }
    Ok(out)
}

fn implements(p: &dyn Plugin, point: &str) -> bool {
    match point {
        "queueSort" => p.as_queue_sort().is_some(),
        "preFilter" => p.as_pre_filter().is_some(),
        "filter" => p.as_filter().is_some(),
        "postFilter" => p.as_post_filter().is_some(),
        "preScore" => p.as_pre_score().is_some(),
        "score" => p.as_score().is_some(),
        "reserve" => p.as_reserve().is_some(),
        "permit" => p.as_permit().is_some(),
        "preBind" => p.as_pre_bind().is_some(),
        "bind" => p.as_bind().is_some(),
        "postBind" => p.as_post_bind().is_some(),
        _ => false,
    }
}

type PointLists = HashMap<&'static str, Vec<(Arc<dyn Plugin>, i64)>>;

fn build_profile(p: &Value, global_pct: Option<i32>, ctx: &FactoryContext) -> Result<Framework> {
    let scheduler_name = p
        .get("schedulerName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(crate::DEFAULT_SCHEDULER_NAME)
        .to_string();
    let pct = percentage(p.get("percentageOfNodesToScore"), "profile")?.or(global_pct);
    let plugins = p.get("plugins").cloned().unwrap_or(json!({}));
    if !plugins.is_object() {
        bail!("plugins must be an object");
    }
    let reg: HashMap<&str, crate::plugins::Factory> = registry().into_iter().collect();
    let mut args: HashMap<String, Value> = HashMap::new();
    for c in p
        .get("pluginConfig")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = c
            .get("name")
            .and_then(Value::as_str)
            .context("pluginConfig entries need a name")?;
        if !reg.contains_key(name) {
            bail!("pluginConfig for unknown plugin {name:?}");
        }
        if args
            .insert(
                name.to_string(),
                c.get("args").cloned().unwrap_or(json!({})),
            )
            .is_some()
        {
            bail!("pluginConfig for {name} given twice");
        }
    }
    // multiPoint: the defaults, minus disabled, plus enabled.
    let mut multi: Vec<(String, i64)> = DEFAULT_PLUGINS
        .iter()
        .map(|(n, w)| (n.to_string(), *w))
        .collect();
    let mp = plugins.get("multiPoint");
    for (name, _) in plugin_names(mp.and_then(|m| m.get("disabled")))? {
        if name == "*" {
            multi.clear();
        } else {
            multi.retain(|(n, _)| *n != name);
        }
    }
    for (name, w) in plugin_names(mp.and_then(|m| m.get("enabled")))? {
        match multi.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1 = w.unwrap_or(e.1),
            None => multi.push((name, w.unwrap_or(1))),
        }
    }
    let mut instances: HashMap<String, Arc<dyn Plugin>> = HashMap::new();
    let mut instance = |name: &str| -> Result<Arc<dyn Plugin>> {
        if let Some(p) = instances.get(name) {
            return Ok(p.clone());
        }
        let f = reg
            .get(name)
            .with_context(|| format!("unknown plugin {name:?}"))?;
        let a = args.get(name).cloned().unwrap_or(json!({}));
        let plugin = f(&a, ctx).with_context(|| format!("plugin {name}"))?;
        instances.insert(name.to_string(), plugin.clone());
        Ok(plugin)
    };
    let mut points: PointLists = HashMap::new();
    for point in EXTENSION_POINTS {
        let mut list: Vec<(Arc<dyn Plugin>, i64)> = Vec::new();
        for (name, w) in &multi {
            let pl = instance(name)?;
            if implements(pl.as_ref(), point) {
                list.push((pl, (*w).max(1)));
            }
        }
        let cfg = plugins.get(*point);
        for (name, _) in plugin_names(cfg.and_then(|c| c.get("disabled")))? {
            if name == "*" {
                list.clear();
            } else {
                list.retain(|(p, _)| p.name() != name);
            }
        }
        for (name, w) in plugin_names(cfg.and_then(|c| c.get("enabled")))? {
            let pl = instance(&name)?;
            if !implements(pl.as_ref(), point) {
                bail!("plugin {name} does not implement {point}");
            }
            let default_w = DEFAULT_PLUGINS
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, w)| (*w).max(1))
                .unwrap_or(1);
            list.retain(|(p, _)| p.name() != name);
            list.push((pl, w.unwrap_or(default_w)));
        }
        points.insert(point, list);
    }
    let take = |points: &mut PointLists, k: &str| -> Vec<Arc<dyn Plugin>> {
        points
            .remove(k)
            .unwrap_or_default()
            .into_iter()
            .map(|(p, _)| p)
            .collect()
    };
    let queue_sort = take(&mut points, "queueSort");
    if queue_sort.len() > 1 {
        bail!("only one queueSort plugin can be enabled");
    }
    let bind = take(&mut points, "bind");
    if bind.is_empty() {
        bail!("at least one bind plugin is needed");
    }
    let score = points
        .remove("score")
        .unwrap_or_default()
        .into_iter()
        .map(|(plugin, weight)| ScorePluginEntry { plugin, weight })
        .collect();
    Ok(Framework {
        scheduler_name,
        queue_sort: queue_sort.into_iter().next(),
        pre_filter: take(&mut points, "preFilter"),
        filter: take(&mut points, "filter"),
        post_filter: take(&mut points, "postFilter"),
        pre_score: take(&mut points, "preScore"),
        score,
        reserve: take(&mut points, "reserve"),
        permit: take(&mut points, "permit"),
        pre_bind: take(&mut points, "preBind"),
        bind,
        post_bind: take(&mut points, "postBind"),
        percentage_of_nodes_to_score: pct,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn ctx() -> FactoryContext {
        FactoryContext {
            client: None,
            metrics: Arc::new(Metrics::default()),
        }
    }

    fn names(list: &[Arc<dyn Plugin>]) -> Vec<&'static str> {
        list.iter().map(|p| p.name()).collect()
    }

    #[test]
    fn the_default_profile_has_kubernetes_default_plugins_and_weights() {
        let fws = Config::default().build(&ctx()).unwrap();
        assert_eq!(fws.len(), 1);
        let fw = &fws[0];
        assert_eq!(fw.scheduler_name, "default-scheduler");
        assert_eq!(
            names(&fw.filter),
            vec![
                "NodeUnschedulable",
                "NodeName",
                "TaintToleration",
                "NodeAffinity",
                "NodePorts",
                "NodeResourcesFit",
                "VolumeRestrictions",
                "VolumeBinding",
                "PodTopologySpread",
                "InterPodAffinity"
            ]
        );
        assert_eq!(names(&fw.reserve), vec!["VolumeBinding"]);
        assert_eq!(names(&fw.pre_bind), vec!["VolumeBinding"]);
        let weights: Vec<(&str, i64)> = fw
            .score
            .iter()
            .map(|e| (e.plugin.name(), e.weight))
            .collect();
        assert!(weights.contains(&("TaintToleration", 3)));
        assert!(weights.contains(&("NodeResourcesFit", 1)));
        assert!(weights.contains(&("PodTopologySpread", 2)));
        assert_eq!(names(&fw.post_filter), vec!["DefaultPreemption"]);
        assert_eq!(names(&fw.bind), vec!["DefaultBinder"]);
    }

    #[test]
    fn profiles_enable_and_disable_plugins_per_extension_point_and_take_args() {
        let text = r#"
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
percentageOfNodesToScore: 30
profiles:
- schedulerName: default-scheduler
- schedulerName: packer
  percentageOfNodesToScore: 70
  plugins:
    score:
      disabled:
      - name: NodeResourcesBalancedAllocation
      - name: ImageLocality
      enabled:
      - name: NodeResourcesFit
        weight: 5
    postFilter:
      disabled:
      - name: '*'
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
"#;
        let fws = Config::parse(text).unwrap().build(&ctx()).unwrap();
        assert_eq!(fws[0].percentage_of_nodes_to_score, Some(30));
        let packer = &fws[1];
        assert_eq!(packer.scheduler_name, "packer");
        assert_eq!(packer.percentage_of_nodes_to_score, Some(70));
        assert!(packer.post_filter.is_empty());
        let score: Vec<(&str, i64)> = packer
            .score
            .iter()
            .map(|e| (e.plugin.name(), e.weight))
            .collect();
        assert!(!score
            .iter()
            .any(|(n, _)| *n == "ImageLocality" || *n == "NodeResourcesBalancedAllocation"));
        assert!(score.contains(&("NodeResourcesFit", 5)));
    }

    #[test]
    fn bad_configurations_are_errors_not_panics() {
        let bad = [
            "kind: Nope\napiVersion: kubescheduler.config.k8s.io/v1",
            "kind: KubeSchedulerConfiguration\napiVersion: v1",
            "kind: KubeSchedulerConfiguration\napiVersion: kubescheduler.config.k8s.io/v1\nprofiles: 3",
            "kind: KubeSchedulerConfiguration\napiVersion: kubescheduler.config.k8s.io/v1\npercentageOfNodesToScore: 101",
            "[1, 2",
            "- a\n- b",
            "kind: KubeSchedulerConfiguration\napiVersion: kubescheduler.config.k8s.io/v1\nleaderElection:\n  leaderElect: maybe",
        ];
        for t in bad {
            assert!(Config::parse(t).is_err(), "{t}");
        }
        let unbuildable = [
            "kind: KubeSchedulerConfiguration\napiVersion: kubescheduler.config.k8s.io/v1\nprofiles:\n- schedulerName: a\n- schedulerName: a",
            "kind: KubeSchedulerConfiguration\napiVersion: kubescheduler.config.k8s.io/v1\nprofiles:\n- plugins:\n    filter:\n      enabled:\n      - name: NoSuchPlugin",
            "kind: KubeSchedulerConfiguration\napiVersion: kubescheduler.config.k8s.io/v1\nprofiles:\n- plugins:\n    bind:\n      disabled:\n      - name: '*'",
            "kind: KubeSchedulerConfiguration\napiVersion: kubescheduler.config.k8s.io/v1\nprofiles:\n- pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      scoringStrategy:\n        type: Bogus",
            "kind: KubeSchedulerConfiguration\napiVersion: kubescheduler.config.k8s.io/v1\nprofiles:\n- plugins:\n    score:\n      enabled:\n      - name: NodePorts",
        ];
        for t in unbuildable {
            let c = Config::parse(t).unwrap();
            assert!(c.build(&ctx()).is_err(), "{t}");
        }
    }

    #[test]
    fn the_file_s_leader_election_is_read() {
        let head = "kind: KubeSchedulerConfiguration\napiVersion: kubescheduler.config.k8s.io/v1\n";
        let parse = |rest: &str| {
            Config::parse(&format!("{head}{rest}"))
                .unwrap()
                .leader_elect
        };
        assert_eq!(parse("leaderElection:\n  leaderElect: false"), Some(false));
        assert_eq!(
            parse("leaderElection:\n  leaderElect: true\n  resourceName: x"),
            Some(true)
        );
        assert_eq!(parse("leaderElection: {}"), None);
        assert_eq!(parse("profiles: []"), None);
    }
}
