//! Executing a network configuration list the way a container runtime does (section 3),
//! modelled on libcni: ADD runs the plugins in order, each getting the previous result; the
//! final result is what the caller caches; DEL runs them in reverse with the cached result;
//! CHECK runs them in order with it. Each plugin's configuration is derived by inserting
//! `cniVersion`, `name`, `runtimeConfig` (capabilities ∩ capability arguments) and
//! `prevResult`, and removing `capabilities`.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::node::Node;
use crate::plugin::{CniCommand, ContainerEnv, PluginOutput};

/// A network configuration list (section 1).
#[derive(Debug, Clone)]
pub struct NetConfList {
    pub cni_version: String,
    pub name: String,
    pub disable_check: bool,
    pub plugins: Vec<Value>,
}

impl NetConfList {
    /// Parses `{"cniVersion", "name", "disableCheck"?, "plugins": [...]}`.
    pub fn from_value(v: &Value) -> anyhow::Result<Self> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        Ok(Self {
            cni_version: s("cniVersion")
                .ok_or_else(|| anyhow::anyhow!("conflist without cniVersion"))?,
            name: s("name").ok_or_else(|| anyhow::anyhow!("conflist without name"))?,
            disable_check: v
                .get("disableCheck")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            plugins: v
                .get("plugins")
                .and_then(Value::as_array)
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("conflist without plugins"))?,
        })
    }

    /// A list of one plugin from a single-plugin configuration (what libcni does with a
    /// `.conf` file): `cniVersion` and `name` move to the list.
    pub fn single(conf: &Value) -> Self {
        Self::chain(conf, Vec::new())
    }

    /// `first` (a full single-plugin configuration) followed by `more` plugin entries.
    pub fn chain(first: &Value, more: Vec<Value>) -> Self {
        let s = |k: &str| {
            first
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let mut plugin = first.clone();
        if let Some(o) = plugin.as_object_mut() {
            o.remove("cniVersion");
            o.remove("name");
        }
        let mut plugins = vec![plugin];
        plugins.extend(more);
        Self {
            cni_version: s("cniVersion"),
            name: s("name"),
            disable_check: false,
            plugins,
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::json!({
            "cniVersion": self.cni_version,
            "name": self.name,
            "disableCheck": self.disable_check,
            "plugins": self.plugins,
        })
    }

    /// The configuration plugin `index` receives (section 3, "Deriving execution
    /// configuration from plugin configuration").
    pub fn exec_config(
        &self,
        index: usize,
        capability_args: &Map<String, Value>,
        prev_result: Option<&Value>,
    ) -> Value {
        let mut conf = self.plugins[index].as_object().cloned().unwrap_or_default();
        let caps = conf.remove("capabilities");
        conf.insert("cniVersion".into(), Value::String(self.cni_version.clone()));
        conf.insert("name".into(), Value::String(self.name.clone()));
        let mut runtime_config = Map::new();
        if let Some(Value::Object(caps)) = caps {
            for (cap, enabled) in caps {
                if enabled == Value::Bool(true) {
                    if let Some(arg) = capability_args.get(&cap) {
                        runtime_config.insert(cap, arg.clone());
                    }
                }
            }
        }
        if !runtime_config.is_empty() {
            conf.insert("runtimeConfig".into(), Value::Object(runtime_config));
        }
        if let Some(prev) = prev_result {
            conf.insert("prevResult".into(), prev.clone());
        }
        Value::Object(conf)
    }

    fn plugin_type(&self, index: usize) -> String {
        self.plugins[index]
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    }

    fn at_least_0_4_0(&self) -> bool {
        !matches!(
            self.cni_version.as_str(),
            "0.1.0" | "0.2.0" | "0.3.0" | "0.3.1"
        )
    }

    /// GC and STATUS exist from 1.1.0 on (libcni skips them for older lists).
    pub fn at_least_1_1_0(&self) -> bool {
        let parts: Vec<u32> = self
            .cni_version
            .split('.')
            .map(|p| p.parse().unwrap_or(0))
            .collect();
        parts >= vec![1, 1, 0]
    }

    /// The configuration plugin `index` receives for GC (spec 1.1, as libcni's
    /// `GCNetworkList` builds it): `cniVersion`, `name` and `cni.dev/valid-attachments`
    /// inserted, no `runtimeConfig` or `prevResult`.
    pub fn gc_config(&self, index: usize, valid: &[(&str, &str)]) -> Value {
        let mut conf = self.exec_config(index, &Map::new(), None);
        let list: Vec<Value> = valid
            .iter()
            .map(|(id, ifname)| serde_json::json!({ "containerID": id, "ifname": ifname }))
            .collect();
        conf["cni.dev/valid-attachments"] = Value::Array(list);
        conf
    }
}

/// The runtime's per-attachment parameters (section 3, "Attachment Parameters").
#[derive(Debug, Clone, Default)]
pub struct Attachment {
    pub container_id: String,
    /// `CNI_NETNS`: a namespace path, or "" (late DEL).
    pub netns: String,
    pub ifname: String,
    pub args: Option<String>,
    /// Capability arguments, e.g. `{"mac": "..."}`, `{"portMappings": [...]}`.
    pub capability_args: Map<String, Value>,
    /// Extra environment for every plugin (e.g. `EBPF_CNI_FAILPOINT`).
    pub extra_env: Vec<(String, String)>,
}

impl Attachment {
    pub fn new(container_id: &str, netns: impl AsRef<Path>, ifname: &str) -> Self {
        Self {
            container_id: container_id.to_owned(),
            netns: netns.as_ref().to_string_lossy().into_owned(),
            ifname: ifname.to_owned(),
            ..Self::default()
        }
    }

    pub fn with_args(mut self, args: &str) -> Self {
        self.args = Some(args.to_owned());
        self
    }

    pub fn with_capability(mut self, key: &str, value: Value) -> Self {
        self.capability_args.insert(key.to_owned(), value);
        self
    }

    /// [`Attachment::with_capability`] for each pair.
    pub fn with_capabilities(self, caps: &[(&str, Value)]) -> Self {
        caps.iter().fold(self, |att, (key, value)| {
            att.with_capability(key, value.clone())
        })
    }
}

/// Why a list operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("plugin type {plugin_type:?} not found in CNI_PATH {cni_path}")]
    PluginNotFound {
        plugin_type: String,
        cni_path: String,
    },
    #[error("plugin {index} ({plugin_type}) failed {}:\n{}", output.command, output.describe())]
    Plugin {
        index: usize,
        plugin_type: String,
        output: Box<PluginOutput>,
    },
    #[error("plugin {index} ({plugin_type}) ADD printed no result:\n{}", output.describe())]
    NoResult {
        index: usize,
        plugin_type: String,
        output: Box<PluginOutput>,
    },
    #[error("configuration version {0} does not support CHECK")]
    CheckUnsupported(String),
    #[error("configuration version {0} does not support GC or STATUS (1.1.0+)")]
    GcStatusUnsupported(String),
    #[error("the harness could not run the plugin")]
    Harness(#[source] anyhow::Error),
}

impl ListError {
    /// The failing plugin's output, when a plugin failed.
    pub fn output(&self) -> Option<&PluginOutput> {
        match self {
            Self::Plugin { output, .. } | Self::NoResult { output, .. } => Some(output),
            _ => None,
        }
    }
}

/// A runtime: where plugins are looked up (`CNI_PATH`).
#[derive(Debug, Clone)]
pub struct CniRuntime {
    pub cni_path: Vec<PathBuf>,
}

impl CniRuntime {
    pub fn new(cni_path: Vec<PathBuf>) -> Self {
        Self { cni_path }
    }

    /// The plugin's own directory first, then the reference plugins (host-local, loopback).
    pub fn with_plugin(plugin: &Path) -> Self {
        let dir = plugin.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::new(vec![dir, PathBuf::from(crate::REFERENCE_PLUGIN_DIR)])
    }

    /// Only the reference plugins.
    pub fn reference() -> Self {
        Self::new(vec![PathBuf::from(crate::REFERENCE_PLUGIN_DIR)])
    }

    /// `CNI_PATH` as passed to plugins.
    pub fn cni_path_env(&self) -> String {
        let dirs: Vec<String> = self
            .cni_path
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        dirs.join(":")
    }

    /// The executable for a `type` (step 1 of every operation).
    pub fn find_plugin(&self, plugin_type: &str) -> Result<PathBuf, ListError> {
        let not_found = || ListError::PluginNotFound {
            plugin_type: plugin_type.to_owned(),
            cni_path: self.cni_path_env(),
        };
        if plugin_type.is_empty() || plugin_type.contains('/') {
            return Err(not_found());
        }
        self.cni_path
            .iter()
            .map(|d| d.join(plugin_type))
            .find(|p| p.is_file())
            .ok_or_else(not_found)
    }

    /// The environment for one attachment.
    pub fn env(&self, att: &Attachment) -> ContainerEnv {
        let mut env = ContainerEnv::new(&att.container_id, &att.netns, &att.ifname)
            .with_cni_path(&self.cni_path_env());
        env.args = att.args.clone();
        env.extra = att.extra_env.clone();
        env
    }

    fn invoke(
        &self,
        node: &Node,
        list: &NetConfList,
        index: usize,
        command: CniCommand,
        att: &Attachment,
        prev: Option<&Value>,
    ) -> Result<PluginOutput, ListError> {
        let plugin_type = list.plugin_type(index);
        let exe = self.find_plugin(&plugin_type)?;
        let conf = list.exec_config(index, &att.capability_args, prev);
        let output = node
            .run(&exe, command, &self.env(att), conf.to_string())
            .map_err(ListError::Harness)?;
        if !output.success() {
            return Err(ListError::Plugin {
                index,
                plugin_type,
                output: Box::new(output),
            });
        }
        Ok(output)
    }

    /// ADD the attachment; returns the final result, which the caller keeps for CHECK and
    /// DEL (the runtime's cache).
    pub fn add(
        &self,
        node: &Node,
        list: &NetConfList,
        att: &Attachment,
    ) -> Result<Value, ListError> {
        let mut prev: Option<Value> = None;
        for index in 0..list.plugins.len() {
            let output = self.invoke(node, list, index, CniCommand::Add, att, prev.as_ref())?;
            match &output.json {
                Some(v) if v.is_object() => prev = Some(v.clone()),
                _ => {
                    return Err(ListError::NoResult {
                        index,
                        plugin_type: list.plugin_type(index),
                        output: Box::new(output),
                    })
                }
            }
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// CHECK the attachment against the cached ADD result. Like libcni, refuses lists
    /// older than 0.4.0 (CHECK did not exist) and succeeds at once with `disableCheck`.
    pub fn check(
        &self,
        node: &Node,
        list: &NetConfList,
        att: &Attachment,
        cached: &Value,
    ) -> Result<(), ListError> {
        if !list.at_least_0_4_0() {
            return Err(ListError::CheckUnsupported(list.cni_version.clone()));
        }
        if list.disable_check {
            return Ok(());
        }
        for index in 0..list.plugins.len() {
            self.invoke(node, list, index, CniCommand::Check, att, Some(cached))?;
        }
        Ok(())
    }

    /// GC of the network (spec 1.1): every plugin in order, with the attachments the
    /// runtime still considers alive. Like libcni, refuses lists older than 1.1.0.
    pub fn gc(
        &self,
        node: &Node,
        list: &NetConfList,
        valid: &[(&str, &str)],
    ) -> Result<(), ListError> {
        if !list.at_least_1_1_0() {
            return Err(ListError::GcStatusUnsupported(list.cni_version.clone()));
        }
        for index in 0..list.plugins.len() {
            self.invoke_network(
                node,
                CniCommand::Gc,
                list,
                index,
                list.gc_config(index, valid),
            )?;
        }
        Ok(())
    }

    /// STATUS of the network (spec 1.1): every plugin in order, the first failure
    /// returned. Like libcni, refuses lists older than 1.1.0.
    pub fn status(&self, node: &Node, list: &NetConfList) -> Result<(), ListError> {
        if !list.at_least_1_1_0() {
            return Err(ListError::GcStatusUnsupported(list.cni_version.clone()));
        }
        for index in 0..list.plugins.len() {
            let conf = list.exec_config(index, &Map::new(), None);
            self.invoke_network(node, CniCommand::Status, list, index, conf)?;
        }
        Ok(())
    }

    /// GC and STATUS run with `CNI_PATH` only: no container, netns or ifname.
    fn invoke_network(
        &self,
        node: &Node,
        command: CniCommand,
        list: &NetConfList,
        index: usize,
        conf: Value,
    ) -> Result<PluginOutput, ListError> {
        let plugin_type = list.plugin_type(index);
        let exe = self.find_plugin(&plugin_type)?;
        let env = ContainerEnv::none().with_cni_path(&self.cni_path_env());
        let output = node
            .run(&exe, command, &env, conf.to_string())
            .map_err(ListError::Harness)?;
        if !output.success() {
            return Err(ListError::Plugin {
                index,
                plugin_type,
                output: Box::new(output),
            });
        }
        Ok(output)
    }

    /// DEL the attachment, plugins in reverse order. Like libcni, the cached result is
    /// passed as `prevResult` only from 0.4.0 on; `None` models a runtime that lost it.
    pub fn del(
        &self,
        node: &Node,
        list: &NetConfList,
        att: &Attachment,
        cached: Option<&Value>,
    ) -> Result<(), ListError> {
        let prev = cached.filter(|_| list.at_least_0_4_0());
        for index in (0..list.plugins.len()).rev() {
            self.invoke(node, list, index, CniCommand::Del, att, prev)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn exec_config_follows_section_3() {
        let list = NetConfList::from_value(&json!({
            "cniVersion": "1.0.0",
            "name": "net",
            "plugins": [
                {"type": "a", "capabilities": {"mac": true, "portMappings": false}, "x": 1},
                {"type": "b"}
            ]
        }))
        .unwrap();
        let mut caps = Map::new();
        caps.insert("mac".into(), json!("aa:bb:cc:dd:ee:ff"));
        caps.insert("portMappings".into(), json!([]));
        caps.insert("bandwidth".into(), json!({}));
        let prev = json!({"cniVersion": "1.0.0"});
        let c = list.exec_config(0, &caps, Some(&prev));
        assert_eq!(c["cniVersion"], "1.0.0");
        assert_eq!(c["name"], "net");
        assert_eq!(c["x"], 1);
        assert!(c.get("capabilities").is_none());
        assert_eq!(c["runtimeConfig"], json!({"mac": "aa:bb:cc:dd:ee:ff"}));
        assert_eq!(c["prevResult"], prev);
        let c = list.exec_config(1, &caps, None);
        assert!(c.get("runtimeConfig").is_none());
        assert!(c.get("prevResult").is_none());
    }

    #[test]
    fn gc_config_lists_the_valid_attachments() {
        let list = NetConfList::single(
            &json!({"cniVersion": "1.1.0", "name": "n", "type": "t", "capabilities": {"mac": true}}),
        );
        assert!(list.at_least_1_1_0());
        assert_eq!(
            list.gc_config(0, &[("c1", "eth0")]),
            json!({"cniVersion": "1.1.0", "name": "n", "type": "t",
                   "cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}]})
        );
        for (v, yes) in [
            ("1.0.0", false),
            ("0.4.0", false),
            ("1.1.0", true),
            ("1.10.0", true),
        ] {
            let l = NetConfList::single(&json!({"cniVersion": v, "name": "n", "type": "t"}));
            assert_eq!(l.at_least_1_1_0(), yes, "{v}");
        }
    }

    #[test]
    fn single_moves_version_and_name_to_the_list() {
        let l = NetConfList::single(&json!({"cniVersion": "0.4.0", "name": "n", "type": "t"}));
        assert_eq!(l.cni_version, "0.4.0");
        assert_eq!(l.plugins, vec![json!({"type": "t"})]);
        assert_eq!(
            l.exec_config(0, &Map::new(), None),
            json!({"cniVersion": "0.4.0", "name": "n", "type": "t"})
        );
    }
}
