//! The FunctionIO document (PROTOCOLS.md §2), as xfn writes and reads it.
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `apiVersion` of FunctionIO documents xfn writes.
pub(crate) const FUNCTION_IO_API_VERSION: &str = "fn.apiextensions.crossplane.io/v1alpha1";

/// `key:` with nothing after it is YAML null; treat it as absent, since
/// functions written in shell print exactly that for an empty list.
fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The FunctionIO document.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct FunctionIo {
    /// Written as [`FUNCTION_IO_API_VERSION`]; accepted absent.
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub(crate) api_version: String,
    /// `FunctionIO`; accepted absent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) kind: String,
    /// The step's config object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) config: Option<Value>,
    /// The observed state.
    #[serde(default, deserialize_with = "nullable")]
    pub(crate) observed: ObservedState,
    /// The desired state so far.
    #[serde(default, deserialize_with = "nullable")]
    pub(crate) desired: DesiredState,
    /// The results so far.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub(crate) results: Vec<AlphaResult>,
}

/// `observed`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct ObservedState {
    /// The XR.
    #[serde(default)]
    pub(crate) composite: ObservedComposite,
    /// Composed resources.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub(crate) resources: Vec<ObservedResource>,
}

/// `observed.composite`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ObservedComposite {
    /// The object.
    #[serde(default)]
    pub(crate) resource: Value,
    /// Its connection details.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub(crate) connection_details: Vec<Value>,
}

/// `observed.resources[]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ObservedResource {
    /// Composition resource name.
    pub(crate) name: String,
    /// The object.
    #[serde(default)]
    pub(crate) resource: Value,
    /// Its connection details.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub(crate) connection_details: Vec<Value>,
}

/// `desired`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct DesiredState {
    /// The desired XR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) composite: Option<ObservedComposite>,
    /// Desired composed resources.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub(crate) resources: Vec<DesiredResource>,
}

/// `desired.resources[]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DesiredResource {
    /// Composition resource name.
    pub(crate) name: String,
    /// The object; `null` means delete.
    #[serde(default)]
    pub(crate) resource: Value,
    /// Connection details to publish.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub(crate) connection_details: Vec<Value>,
    /// How to tell it is ready.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub(crate) readiness_checks: Vec<ReadinessCheck>,
}

/// `readinessChecks[]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReadinessCheck {
    /// MatchString, MatchInteger, NonEmpty, None or MatchCondition.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// Dotted path into the observed resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) field_path: Option<String>,
    /// For MatchString.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) match_string: Option<String>,
    /// For MatchInteger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) match_integer: Option<i64>,
    /// For MatchCondition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) match_condition: Option<MatchCondition>,
}

/// `matchCondition`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct MatchCondition {
    /// Condition type.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// Wanted status.
    pub(crate) status: String,
}

/// `results[]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct AlphaResult {
    /// Fatal, Warning or Normal.
    pub(crate) severity: String,
    /// The message.
    #[serde(default)]
    pub(crate) message: String,
}
