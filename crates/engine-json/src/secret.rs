//! The Engine API's `Secret`, `SecretSpec`, `Config` and `ConfigSpec` JSON, with conversions to and from the
//! stored `shoal_api` objects. `Data` is Go's `[]byte`: standard base64 with padding (line breaks ignored, as
//! Go's decoder does). A secret's `Data` is never written by `SecretJson::from_api` (Docker's `SecretFromGRPC`
//! does not copy it either), whatever the object holds; a config's is.
//!
//! Must not depend on HTTP or the store.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use shoal_api::{Annotations, Config, ConfigSpec, Driver, Secret, SecretSpec};

use super::common::*;
use super::spec::DriverJson;

/// `SecretSpec` (the body of `POST /secrets/create` and `/secrets/{id}/update`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SecretSpecJson {
    /// The secret's name.
    pub name: String,
    /// User labels.
    pub labels: BTreeMap<String, String>,
    /// The data, base64: read on create (and compared on update), never written in an answer.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub data: String,
    /// An external secret driver: read only to be refused by the control API.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverJson>,
    /// The templating driver (`golang`) or none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub templating: Option<DriverJson>,
}

/// `Secret`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct SecretJson {
    /// Secret ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Version to pass to an update.
    pub version: VersionJson,
    /// Creation time.
    pub created_at: String,
    /// Last update time.
    pub updated_at: String,
    /// The spec, without the data.
    pub spec: SecretSpecJson,
}

/// `ConfigSpec` (the body of `POST /configs/create` and `/configs/{id}/update`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ConfigSpecJson {
    /// The config's name.
    pub name: String,
    /// User labels.
    pub labels: BTreeMap<String, String>,
    /// The data, base64.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub data: String,
    /// The templating driver (`golang`) or none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub templating: Option<DriverJson>,
}

/// `Config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ConfigJson {
    /// Config ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Version to pass to an update.
    pub version: VersionJson,
    /// Creation time.
    pub created_at: String,
    /// Last update time.
    pub updated_at: String,
    /// The spec, with the data.
    pub spec: ConfigSpecJson,
}

/// `Data` as Go's `encoding/json` decodes a `[]byte`. The error says where the base64 breaks, never what the
/// bytes are (they may be a secret's).
pub fn data_from_base64(s: &str) -> Result<Vec<u8>, ConvertError> {
    let cleaned: String = s.chars().filter(|c| *c != '\r' && *c != '\n').collect();
    base64::engine::general_purpose::STANDARD.decode(cleaned.as_bytes()).map_err(|e| {
        let at = match e {
            base64::DecodeError::InvalidByte(at, _) | base64::DecodeError::InvalidLastSymbol(at, _) => at,
            base64::DecodeError::InvalidLength(len) => len,
            base64::DecodeError::InvalidPadding => cleaned.len(),
        };
        ConvertError(format!("Data: illegal base64 data at input byte {at}: send the data as standard base64"))
    })
}

/// `Data` as Go's `encoding/json` encodes a `[]byte`.
pub fn data_to_base64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// A driver that names nothing and has no options is no driver (as the engine's `nil`).
fn driver_to_api(d: Option<&DriverJson>) -> Option<Driver> {
    d.filter(|d| !d.name.is_empty() || !d.options.is_empty())
        .map(|d| Driver { name: d.name.clone(), options: labels_from_json(&d.options) })
}

fn driver_from_api(d: Option<&Driver>) -> Option<DriverJson> {
    d.map(|d| DriverJson { name: d.name.clone(), options: labels_to_json(&d.options) })
}

fn annotations(name: &str, labels: &BTreeMap<String, String>) -> Option<Annotations> {
    Some(Annotations { name: name.to_string(), labels: labels_from_json(labels), ..Default::default() })
}

fn name_and_labels(a: Option<&Annotations>) -> (String, BTreeMap<String, String>) {
    (a.map(|a| a.name.clone()).unwrap_or_default(), a.map(|a| labels_to_json(&a.labels)).unwrap_or_default())
}

impl SecretSpecJson {
    /// To the API spec (the data decoded from base64).
    pub fn to_api(&self) -> Result<SecretSpec, ConvertError> {
        Ok(SecretSpec {
            annotations: annotations(&self.name, &self.labels),
            data: data_from_base64(&self.data)?,
            templating: driver_to_api(self.templating.as_ref()),
            driver: driver_to_api(self.driver.as_ref()),
        })
    }
}

impl SecretJson {
    /// From a stored secret; the data is left out whatever the secret holds.
    pub fn from_api(s: &Secret) -> SecretJson {
        let (version, created_at, updated_at) = meta_parts(s.meta.as_ref());
        let spec = s.spec.clone().unwrap_or_default();
        let (name, labels) = name_and_labels(spec.annotations.as_ref());
        SecretJson {
            id: s.id.clone(),
            version,
            created_at,
            updated_at,
            spec: SecretSpecJson {
                name,
                labels,
                data: String::new(),
                driver: driver_from_api(spec.driver.as_ref()),
                templating: driver_from_api(spec.templating.as_ref()),
            },
        }
    }
}

impl ConfigSpecJson {
    /// To the API spec (the data decoded from base64).
    pub fn to_api(&self) -> Result<ConfigSpec, ConvertError> {
        Ok(ConfigSpec {
            annotations: annotations(&self.name, &self.labels),
            data: data_from_base64(&self.data)?,
            templating: driver_to_api(self.templating.as_ref()),
        })
    }

    /// From an API spec (the data encoded in base64).
    pub fn from_api(spec: &ConfigSpec) -> ConfigSpecJson {
        let (name, labels) = name_and_labels(spec.annotations.as_ref());
        ConfigSpecJson {
            name,
            labels,
            data: data_to_base64(&spec.data),
            templating: driver_from_api(spec.templating.as_ref()),
        }
    }
}

impl ConfigJson {
    /// From a stored config, data included.
    pub fn from_api(c: &Config) -> ConfigJson {
        let (version, created_at, updated_at) = meta_parts(c.meta.as_ref());
        ConfigJson {
            id: c.id.clone(),
            version,
            created_at,
            updated_at,
            spec: ConfigSpecJson::from_api(&c.spec.clone().unwrap_or_default()),
        }
    }
}

fn meta_parts(meta: Option<&shoal_api::Meta>) -> (VersionJson, String, String) {
    (
        VersionJson::from_api(meta.and_then(|m| m.version.as_ref())),
        time_to_json(meta.and_then(|m| m.created_at.as_ref())),
        time_to_json(meta.and_then(|m| m.updated_at.as_ref())),
    )
}
