//! Networks in the Engine API's JSON: the network resource of `/networks` (`NetworkJson`, as `docker network
//! inspect` prints a swarm-scope overlay network), the create request (`NetworkCreateJson`: what Shoal cannot
//! honour is refused with a 400 naming the field), and the swarm forms inside service and task documents (a
//! service's `Endpoint.VirtualIPs`, a task's `NetworksAttachments`).
//!
//! Must not depend on HTTP or the store.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use shoal_api::{Annotations, Driver, IpamConfig, IpamOptions, Network, NetworkAttachment, NetworkSpec};

use super::common::{is_empty_map, labels_from_json, labels_to_json, ConvertError, VersionJson};
use super::objects::meta_parts;

/// `IPAMConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IpamConfigJson {
    /// The subnet, CIDR.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subnet: String,
    /// The range addresses are given from, CIDR inside the subnet.
    #[serde(rename = "IPRange", skip_serializing_if = "String::is_empty")]
    pub ip_range: String,
    /// The gateway address.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub gateway: String,
    /// Reserved addresses by name (`--aux-address`): never given to a task.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub auxiliary_addresses: BTreeMap<String, String>,
}

/// `IPAM`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IpamJson {
    /// "default" (the only IPAM driver).
    pub driver: String,
    /// One config per subnet (Shoal: at most one).
    pub config: Vec<IpamConfigJson>,
    /// The IPAM driver's options: kept and shown back (the default driver reads none).
    pub options: Option<BTreeMap<String, String>>,
}

/// `ConfigReference` of a network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ConfigFromJson {
    /// The config-only network this one takes its settings from.
    pub network: String,
}

/// A network as `GET /networks` and `GET /networks/{id}` return it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NetworkJson {
    /// The name.
    pub name: String,
    /// The ID.
    pub id: String,
    /// Creation time.
    pub created: String,
    /// "swarm".
    pub scope: String,
    /// "overlay".
    pub driver: String,
    /// Always true (IPv4 networks).
    #[serde(rename = "EnableIPv4")]
    pub enable_ipv4: bool,
    /// Always false.
    #[serde(rename = "EnableIPv6")]
    pub enable_ipv6: bool,
    /// Address management.
    #[serde(rename = "IPAM")]
    pub ipam: IpamJson,
    /// No access from outside the network.
    pub internal: bool,
    /// Standalone containers may attach.
    pub attachable: bool,
    /// The routing mesh's network.
    pub ingress: bool,
    /// The config-only network of each node that a node-local network (macvlan, ipvlan) takes its settings
    /// from; empty for others.
    pub config_from: ConfigFromJson,
    /// Always false.
    pub config_only: bool,
    /// Containers on this node attached (none known to the manager).
    pub containers: BTreeMap<String, serde_json::Value>,
    /// Driver state (the VXLAN ID).
    pub options: BTreeMap<String, String>,
    /// User labels.
    pub labels: BTreeMap<String, String>,
}

fn ipam_json(i: Option<&IpamOptions>) -> IpamJson {
    let i = i.cloned().unwrap_or_default();
    let driver_options = i.driver.as_ref().map(|d| d.options.clone().into_iter().collect()).unwrap_or_default();
    IpamJson {
        driver: i.driver.map(|d| d.name).filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into()),
        config: i
            .configs
            .iter()
            .map(|c| IpamConfigJson {
                subnet: c.subnet.clone(),
                ip_range: c.range.clone(),
                gateway: c.gateway.clone(),
                auxiliary_addresses: c.reserved.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            })
            .collect(),
        // An object, never null, as the API document has it.
        options: Some(driver_options),
    }
}

impl NetworkJson {
    /// Converts from a stored network.
    pub fn from_api(n: &Network) -> NetworkJson {
        let spec = n.spec.clone().unwrap_or_default();
        let ann = spec.annotations.clone().unwrap_or_default();
        let (_, created, _) = meta_parts(n.meta.as_ref());
        NetworkJson {
            name: ann.name,
            id: n.id.clone(),
            created,
            scope: "swarm".into(),
            driver: n.driver_state.as_ref().map(|d| d.name.clone()).unwrap_or_else(|| "overlay".into()),
            enable_ipv4: true,
            enable_ipv6: spec.ipv6_enabled,
            ipam: ipam_json(n.ipam.as_ref()),
            internal: spec.internal,
            attachable: spec.attachable,
            ingress: spec.ingress,
            config_from: match &spec.config_from {
                Some(shoal_api::network_spec::ConfigFrom::Network(from)) => ConfigFromJson { network: from.clone() },
                None => ConfigFromJson::default(),
            },
            config_only: false,
            containers: BTreeMap::new(),
            // An overlay's driver state (its VXLAN ID); a node-local network's own options (`parent`).
            options: if n.node_local_driver().is_some() {
                spec.driver_config.as_ref().map(|d| labels_to_json(&d.options)).unwrap_or_default()
            } else {
                n.driver_state.as_ref().map(|d| labels_to_json(&d.options)).unwrap_or_default()
            },
            labels: labels_to_json(&ann.labels),
        }
    }
}

/// The body of `POST /networks/create`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NetworkCreateJson {
    /// The name.
    pub name: String,
    /// The driver: "overlay" (Docker's default "bridge" is local, refused).
    pub driver: String,
    /// "" or "swarm".
    pub scope: String,
    /// No access from outside the network.
    pub internal: bool,
    /// Standalone containers may attach.
    pub attachable: bool,
    /// The routing mesh's network (only when none exists).
    pub ingress: bool,
    /// Refused when true (a config-only network is each node's engine's: the relay gives it to the engine
    /// unless it says `Scope: swarm`).
    pub config_only: bool,
    /// For macvlan and ipvlan: the config-only network of each node that holds the settings.
    pub config_from: Option<ConfigFromJson>,
    /// Address management.
    #[serde(rename = "IPAM")]
    pub ipam: Option<IpamJson>,
    /// Refused when false.
    #[serde(rename = "EnableIPv4")]
    pub enable_ipv4: Option<bool>,
    /// An IPv6 subnet beside the IPv4 one (the control API checks the configs).
    #[serde(rename = "EnableIPv6")]
    pub enable_ipv6: Option<bool>,
    /// Driver options (the control API refuses those it does not know).
    pub options: BTreeMap<String, String>,
    /// User labels.
    pub labels: BTreeMap<String, String>,
    /// Ignored, as the engine does since API 1.44 (names are always unique).
    pub check_duplicate: Option<bool>,
}

impl NetworkCreateJson {
    /// The spec to create, or a 400 naming the first field Shoal cannot honour.
    pub fn to_api(&self) -> Result<NetworkSpec, ConvertError> {
        let driver = if self.driver.is_empty() { "bridge" } else { self.driver.as_str() };
        if driver != "overlay" && !shoal_api::NODE_LOCAL_DRIVERS.contains(&driver) {
            return Err(ConvertError(format!(
                "Driver {driver:?} is not supported for a swarm network: use -d overlay, or macvlan or ipvlan \
                 (each node's engine makes those)"
            )));
        }
        if !(self.scope.is_empty() || self.scope == "swarm") {
            return Err(ConvertError(format!(
                "Scope {:?} is not supported: swarm networks are swarm-scope",
                self.scope
            )));
        }
        if driver != "overlay" && self.scope != "swarm" {
            return Err(ConvertError(format!(
                "Driver {driver:?} is not supported without --scope swarm: such a network is the node's engine's own \
                 (a node with the docker executor gives it to its engine); add --scope swarm for a swarm network"
            )));
        }
        if self.config_only {
            return Err(ConvertError(
                "a ConfigOnly network is each node's own: create it on each node's engine without --scope swarm, \
                 then a swarm network with --config-from naming it"
                    .into(),
            ));
        }
        let config_from = self
            .config_from
            .as_ref()
            .filter(|c| !c.network.is_empty())
            .map(|c| shoal_api::network_spec::ConfigFrom::Network(c.network.clone()));
        if self.enable_ipv4 == Some(false) {
            return Err(ConvertError("EnableIPv4 false is not supported: overlay networks are IPv4".into()));
        }
        let mut ipam = None;
        if let Some(i) = &self.ipam {
            if !(i.driver.is_empty() || i.driver == "default") {
                return Err(ConvertError(format!("IPAM.Driver {:?} is not supported: use the default IPAM", i.driver)));
            }
            // Several configs are several subnets: the control API checks them and their bound.
            ipam = Some(IpamOptions {
                // The default IPAM's options are kept and shown back, as Docker keeps them (it reads none).
                driver: Some(Driver {
                    name: "default".into(),
                    options: i.options.as_ref().map(labels_from_json).unwrap_or_default(),
                }),
                configs: i
                    .config
                    .iter()
                    .map(|c| IpamConfig {
                        subnet: c.subnet.clone(),
                        range: c.ip_range.clone(),
                        gateway: c.gateway.clone(),
                        reserved: c.auxiliary_addresses.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                        ..Default::default()
                    })
                    .collect(),
            });
        }
        Ok(NetworkSpec {
            annotations: Some(Annotations {
                name: self.name.clone(),
                labels: labels_from_json(&self.labels),
                indices: vec![],
            }),
            driver_config: Some(Driver { name: driver.into(), options: labels_from_json(&self.options) }),
            ipv6_enabled: self.enable_ipv6 == Some(true),
            internal: self.internal,
            ipam,
            attachable: self.attachable,
            ingress: self.ingress,
            config_from,
        })
    }
}

/// `POST /networks/create`'s answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NetworkCreateResponse {
    /// The new network's ID.
    pub id: String,
    /// Warnings (none).
    pub warning: String,
}

/// `Endpoint.VirtualIPs[]` of a service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct VirtualIpJson {
    /// The network.
    #[serde(rename = "NetworkID")]
    pub network_id: String,
    /// The address, CIDR form.
    pub addr: String,
}

/// A network as the swarm types show it inside a task (`NetworksAttachments[].Network`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SwarmNetworkJson {
    /// The ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Version.
    pub version: VersionJson,
    /// Creation time.
    pub created_at: String,
    /// Last update time.
    pub updated_at: String,
    /// The spec.
    pub spec: SwarmNetworkSpecJson,
    /// Driver state.
    pub driver_state: DriverStateJson,
    /// Address management.
    #[serde(rename = "IPAMOptions")]
    pub ipam_options: SwarmIpamJson,
}

/// `Network.Spec` in the swarm types.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SwarmNetworkSpecJson {
    /// The name.
    pub name: String,
    /// User labels.
    pub labels: BTreeMap<String, String>,
    /// The driver.
    pub driver_configuration: DriverStateJson,
    /// `--ipv6` (left out when false, as Docker leaves it out).
    #[serde(rename = "IPv6Enabled", skip_serializing_if = "std::ops::Not::not")]
    pub ipv6_enabled: bool,
    /// Internal.
    pub internal: bool,
    /// Attachable.
    pub attachable: bool,
    /// Ingress.
    pub ingress: bool,
    /// "swarm".
    pub scope: String,
}

/// A driver name and options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DriverStateJson {
    /// The driver.
    pub name: String,
    /// Its options.
    #[serde(skip_serializing_if = "is_empty_map")]
    pub options: BTreeMap<String, String>,
}

/// `IPAMOptions` in the swarm types.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SwarmIpamJson {
    /// The IPAM driver.
    pub driver: DriverStateJson,
    /// The subnets.
    pub configs: Vec<IpamConfigJson>,
}

/// `NetworksAttachments[]` of a task.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NetworkAttachmentStatusJson {
    /// The network as it was when the task was allocated.
    pub network: SwarmNetworkJson,
    /// The task's addresses on it, CIDR form.
    pub addresses: Vec<String>,
}

fn driver_json(d: Option<&Driver>) -> DriverStateJson {
    d.map(|d| DriverStateJson { name: d.name.clone(), options: labels_to_json(&d.options) }).unwrap_or_default()
}

impl NetworkAttachmentStatusJson {
    /// Converts from a task's attachment.
    pub fn from_api(a: &NetworkAttachment) -> NetworkAttachmentStatusJson {
        let n = a.network.clone().unwrap_or_default();
        let spec = n.spec.clone().unwrap_or_default();
        let ann = spec.annotations.clone().unwrap_or_default();
        let (version, created_at, updated_at) = meta_parts(n.meta.as_ref());
        let ipam = ipam_json(n.ipam.as_ref());
        NetworkAttachmentStatusJson {
            network: SwarmNetworkJson {
                id: n.id.clone(),
                version,
                created_at,
                updated_at,
                spec: SwarmNetworkSpecJson {
                    name: ann.name,
                    labels: labels_to_json(&ann.labels),
                    driver_configuration: driver_json(spec.driver_config.as_ref()),
                    ipv6_enabled: spec.ipv6_enabled,
                    internal: spec.internal,
                    attachable: spec.attachable,
                    ingress: spec.ingress,
                    scope: "swarm".into(),
                },
                driver_state: driver_json(n.driver_state.as_ref()),
                ipam_options: SwarmIpamJson {
                    driver: DriverStateJson { name: ipam.driver, options: ipam.options.unwrap_or_default() },
                    configs: ipam.config,
                },
            },
            addresses: a.addresses.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(body: serde_json::Value) -> Result<NetworkSpec, String> {
        let j: NetworkCreateJson = crate::go_decode::from_value(body).unwrap();
        j.to_api().map_err(|e| e.0)
    }

    #[test]
    fn what_the_docker_cli_sends_converts_and_what_shoal_cannot_honour_is_refused() {
        let s = create(serde_json::json!({
            "Name": "appnet", "Driver": "overlay", "Scope": "", "EnableIPv4": null, "EnableIPv6": null,
            "IPAM": {"Driver": "default", "Config": [{"Subnet": "10.5.0.0/24", "IPRange": "10.5.0.128/25",
                "Gateway": "10.5.0.1"}], "Options": {}},
            "Internal": true, "Attachable": true, "Ingress": false, "ConfigOnly": false, "ConfigFrom": null,
            "Options": {}, "Labels": {"team": "a"}
        }))
        .unwrap();
        assert!(s.internal && s.attachable);
        let c = &s.ipam.as_ref().unwrap().configs[0];
        assert_eq!(
            (c.subnet.as_str(), c.range.as_str(), c.gateway.as_str()),
            ("10.5.0.0/24", "10.5.0.128/25", "10.5.0.1")
        );
        assert_eq!(s.annotations.unwrap().labels["team"], "a");
        for (body, field) in [
            (serde_json::json!({"Name": "x"}), "Driver \"bridge\""),
            (serde_json::json!({"Name": "x", "Driver": "bridge", "Scope": "swarm"}), "Driver \"bridge\""),
            (serde_json::json!({"Name": "x", "Driver": "macvlan"}), "Driver \"macvlan\" is not supported without"),
            (serde_json::json!({"Name": "x", "Driver": "macvlan", "Scope": "swarm", "ConfigOnly": true}), "ConfigOnly"),
            (serde_json::json!({"Name": "x", "Driver": "overlay", "Scope": "local"}), "Scope"),
            (serde_json::json!({"Name": "x", "Driver": "overlay", "ConfigOnly": true}), "ConfigOnly"),
            (serde_json::json!({"Name": "x", "Driver": "overlay", "IPAM": {"Driver": "dhcp"}}), "IPAM.Driver"),
        ] {
            let e = create(body).unwrap_err();
            assert!(e.contains(field), "{e}");
        }
        // EnableIPv6 reaches the spec with its configs (the control API checks them).
        let v6 = create(serde_json::json!({"Name": "d", "Driver": "overlay", "EnableIPv6": true,
            "IPAM": {"Config": [{"Subnet": "fd00:1::/64"}]}}))
        .unwrap();
        assert!(v6.ipv6_enabled);
        assert_eq!(v6.ipam.unwrap().configs[0].subnet, "fd00:1::/64");
        // A swarm network of each node's engine keeps its driver and the config-only network it names.
        let m = create(
            serde_json::json!({"Name": "m", "Driver": "macvlan", "Scope": "swarm", "ConfigFrom": {"Network": "cfg"}}),
        )
        .unwrap();
        assert_eq!(m.driver_config.unwrap().name, "macvlan");
        assert_eq!(m.config_from, Some(shoal_api::network_spec::ConfigFrom::Network("cfg".into())));
    }

    #[test]
    fn a_stored_network_reads_as_docker_shows_an_overlay_network() {
        let n = shoal_manager_free_network();
        let j = serde_json::to_value(NetworkJson::from_api(&n)).unwrap();
        assert_eq!(j["Scope"], "swarm");
        assert_eq!(j["Driver"], "overlay");
        assert_eq!(j["IPAM"]["Config"][0]["Subnet"], "10.0.1.0/24");
        assert_eq!(j["IPAM"]["Config"][0]["Gateway"], "10.0.1.1");
        assert_eq!(j["Options"]["com.docker.network.driver.overlay.vxlanid_list"], "4098");
        let a = NetworkAttachment { network: Some(n), addresses: vec!["10.0.1.3/24".into()], ..Default::default() };
        let j = serde_json::to_value(NetworkAttachmentStatusJson::from_api(&a)).unwrap();
        assert_eq!(j["Network"]["Spec"]["Name"], "appnet");
        assert_eq!(j["Addresses"][0], "10.0.1.3/24");
        assert!(j["Network"]["Spec"].get("IPv6Enabled").is_none(), "left out when false, as Docker does");
    }

    /// An `--ipv6` network as the manager stores it (its IPv4 config first, its IPv6 one second) shows both
    /// configs and `EnableIPv6`; a task's attachment shows both addresses, IPv4 first.
    #[test]
    fn an_ipv6_network_shows_both_configs_and_its_tasks_both_addresses() {
        let mut n = shoal_manager_free_network();
        n.spec.as_mut().unwrap().ipv6_enabled = true;
        n.ipam.as_mut().unwrap().configs.push(IpamConfig {
            subnet: "fd00:1::/64".into(),
            gateway: "fd00:1::1".into(),
            ..Default::default()
        });
        let j = serde_json::to_value(NetworkJson::from_api(&n)).unwrap();
        assert_eq!(j["EnableIPv6"], true);
        let configs: Vec<(&str, &str)> = j["IPAM"]["Config"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["Subnet"].as_str().unwrap(), c["Gateway"].as_str().unwrap()))
            .collect();
        assert_eq!(configs, [("10.0.1.0/24", "10.0.1.1"), ("fd00:1::/64", "fd00:1::1")]);
        let addresses = vec!["10.0.1.3/24".to_string(), "fd00:1::2/64".to_string()];
        let a = NetworkAttachment { network: Some(n), addresses, ..Default::default() };
        let j = serde_json::to_value(NetworkAttachmentStatusJson::from_api(&a)).unwrap();
        assert_eq!(j["Network"]["Spec"]["IPv6Enabled"], true);
        assert_eq!(j["Addresses"], serde_json::json!(["10.0.1.3/24", "fd00:1::2/64"]));
    }

    fn shoal_manager_free_network() -> Network {
        Network {
            id: "n1".into(),
            spec: Some(NetworkSpec {
                annotations: Some(Annotations { name: "appnet".into(), ..Default::default() }),
                ..Default::default()
            }),
            driver_state: Some(Driver {
                name: "overlay".into(),
                options: [("com.docker.network.driver.overlay.vxlanid_list".to_string(), "4098".to_string())].into(),
            }),
            ipam: Some(IpamOptions {
                driver: None,
                configs: vec![IpamConfig {
                    subnet: "10.0.1.0/24".into(),
                    gateway: "10.0.1.1".into(),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }
    }
}
