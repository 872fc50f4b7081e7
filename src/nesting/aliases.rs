//! What an input's aliases expand to, weighed from libyaml's events before
//! yaml_serde builds the copies, and refused past go-yaml v3's rule.
//!
//! Invariant: every copy yaml_serde would build is weighed first, at the
//! copied node's weight with the aliases inside it expanded (a billion
//! laughs weighs a billion, saturating), and the input is refused once
//! copies pass [`allowed`]'s share of the total. A weight estimates built
//! bytes: [`NODE_WEIGHT`] per node plus a scalar's bytes.
//!
//! The rule (go-yaml's `allowedAliasRatio`, weights for decode counts):
//! copies may be 99% of a total up to [`RATIO_RANGE_LOW`], 10% past
//! [`RATIO_RANGE_HIGH`], sliding between; nothing is refused under
//! [`MIN_COPIES`] of copies or [`MIN_TOTAL`] in all. So copies weigh at
//! most about 12 MiB, or a tenth of a document weighing over 120 MiB.
//!
//! Resolved as yaml_serde does: its loader numbers an anchor by how many
//! names the document defined before it (a redefined name and the next new
//! one share a number) and looks a number's node up only once the whole
//! document is read. Weights are kept per number, afresh per document; a
//! number taken again after an alias to it (a name defined twice, then a
//! new one) is refused, as that alias would copy a node other than the one
//! weighed. An alias inside the node it names (a copy without end) is
//! refused too. The pass holds an anchor's name and a few words per anchor
//! and open collection, less than yaml_serde's loader holds for the input.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{EventKind, Libyaml, NestingError, TOKENS_PER_LOOK};

/// What one built node weighs beside its scalar bytes: measured 74 (a
/// sequence item) to 118 (a mapping key or value) bytes in yaml_serde's
/// `Value`, 33 to 82 in serde_json's.
pub(super) const NODE_WEIGHT: u64 = 100;

/// Up to this total, copies may be 99% of it (go-yaml: 400,000 decodes).
pub(super) const RATIO_RANGE_LOW: u64 = 4 << 20;

/// Past this total, copies may be 10% of it (go-yaml: 4,000,000 decodes).
pub(super) const RATIO_RANGE_HIGH: u64 = 40 << 20;

/// Copies under this weight are never refused (go-yaml: 100 decodes).
pub(super) const MIN_COPIES: u64 = 100 * NODE_WEIGHT;

/// Totals under this weight are never refused (go-yaml: 1,000 decodes).
pub(super) const MIN_TOTAL: u64 = 1000 * NODE_WEIGHT;

/// The share of `total` that copies may take.
pub(super) fn allowed(total: u64) -> f64 {
    if total <= RATIO_RANGE_LOW {
        0.99
    } else if total >= RATIO_RANGE_HIGH {
        0.10
    } else {
        let range = (RATIO_RANGE_HIGH - RATIO_RANGE_LOW) as f64;
        0.99 - 0.89 * ((total - RATIO_RANGE_LOW) as f64 / range)
    }
}

/// Whether `copies` of a `total` (copies included) are past the rule.
pub(super) fn excessive(copies: u64, total: u64) -> bool {
    copies > MIN_COPIES && total > MIN_TOTAL && copies as f64 / total as f64 > allowed(total)
}

/// A collection not yet closed.
struct Open {
    /// Its weight so far, aliases inside it expanded.
    weight: u64,
    /// The anchor number it defines and the event that defined it.
    anchor: Option<(usize, u64)>,
}

/// What an anchor number names now.
#[derive(Clone, Copy, Default)]
struct Slot {
    /// The event that defined it.
    defined_at: u64,
    /// Its expanded weight; `None` while its node is still open.
    weight: Option<u64>,
    /// Whether an alias was resolved to it.
    aliased: bool,
}

/// Gives `name` the next number, as yaml_serde's loader does (how many
/// names were defined before it, reused when a name is redefined), and
/// that number the node defined at event `serial`. `None` when the number
/// was already aliased: yaml_serde resolves aliases to the node that holds
/// their number once the whole document is read, so those aliases would
/// copy this node, not the one weighed for them.
fn define(
    numbers: &mut BTreeMap<Box<[u8]>, usize>,
    slots: &mut Vec<Slot>,
    name: Box<[u8]>,
    weight: Option<u64>,
    serial: u64,
) -> Option<(usize, u64)> {
    let number = numbers.len();
    numbers.insert(name, number);
    if slots.len() <= number {
        slots.resize(number + 1, Slot::default());
    }
    if slots[number].aliased {
        return None;
    }
    slots[number] = Slot {
        defined_at: serial,
        weight,
        aliased: false,
    };
    Some((number, serial))
}

/// What an accepted input weighs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Weights {
    /// Its own nodes and scalars, each alias one node.
    pub(super) own: u64,
    /// The copies its aliases expand to.
    pub(super) copies: u64,
}

/// Refuses `input` when its aliases expand past the rule or into
/// themselves; stops with [`NestingError::Abandoned`] once `stop` is set.
/// Where libyaml stops (a syntax error), so does this, as yaml_serde's
/// loader does.
pub(super) fn check_until(input: &[u8], stop: &AtomicBool) -> Result<Weights, NestingError> {
    let Some(mut parser) = Libyaml::new(input) else {
        return Ok(Weights::default());
    };
    let (mut own, mut copies) = (0u64, 0u64);
    // Per document, as yaml_serde's loader: name -> number, number -> node.
    let mut numbers: BTreeMap<Box<[u8]>, usize> = BTreeMap::new();
    let mut slots: Vec<Slot> = Vec::new();
    let mut open: Vec<Open> = Vec::new();
    let mut serial = 0u64;
    let mut until_look = TOKENS_PER_LOOK;
    while let Some(event) = parser.next_event() {
        serial += 1;
        let (line, column) = (event.mark.line + 1, event.mark.column + 1);
        let redefined = NestingError::RedefinedAnchor { line, column };
        // The weight this event adds to the collection it is in.
        let added = match event.kind {
            EventKind::DocumentStart => {
                numbers.clear();
                slots.clear();
                None
            }
            EventKind::Scalar { bytes } => {
                let weight = NODE_WEIGHT.saturating_add(bytes);
                own = own.saturating_add(weight);
                if let Some(name) = event.anchor {
                    define(&mut numbers, &mut slots, name, Some(weight), serial)
                        .ok_or(redefined)?;
                }
                Some(weight)
            }
            EventKind::CollectionStart => {
                own = own.saturating_add(NODE_WEIGHT);
                let anchor = match event.anchor {
                    Some(name) => Some(
                        define(&mut numbers, &mut slots, name, None, serial).ok_or(redefined)?,
                    ),
                    None => None,
                };
                open.push(Open {
                    weight: NODE_WEIGHT,
                    anchor,
                });
                None
            }
            EventKind::CollectionEnd => open.pop().map(|closed| {
                if let Some((number, defined_at)) = closed.anchor {
                    // Unless a later definition took its number meanwhile.
                    if let Some(slot) = slots.get_mut(number) {
                        if slot.defined_at == defined_at {
                            slot.weight = Some(closed.weight);
                        }
                    }
                }
                closed.weight
            }),
            EventKind::Alias => {
                own = own.saturating_add(NODE_WEIGHT);
                let slot = event
                    .anchor
                    .and_then(|name| numbers.get(&name).copied())
                    .and_then(|number| slots.get_mut(number));
                match slot {
                    Some(Slot { weight: None, .. }) => {
                        return Err(NestingError::RecursiveAlias { line, column })
                    }
                    Some(Slot {
                        weight: Some(weight),
                        aliased,
                        ..
                    }) => {
                        *aliased = true;
                        copies = copies.saturating_add(*weight);
                        Some(*weight)
                    }
                    // An unknown anchor: yaml_serde refuses it.
                    None => Some(NODE_WEIGHT),
                }
            }
            EventKind::Other => None,
        };
        if let (Some(weight), Some(parent)) = (added, open.last_mut()) {
            parent.weight = parent.weight.saturating_add(weight);
        }
        let total = own.saturating_add(copies);
        if excessive(copies, total) {
            return Err(NestingError::Aliasing {
                copies_permille: (copies as f64 * 1000.0 / total as f64).ceil() as u64,
                allowed_permille: (allowed(total) * 1000.0).floor() as u64,
                total_kib: total / 1024,
                line,
                column,
            });
        }
        until_look -= 1;
        if until_look == 0 {
            if stop.load(Ordering::Relaxed) {
                return Err(NestingError::Abandoned);
            }
            until_look = TOKENS_PER_LOOK;
        }
    }
    Ok(Weights { own, copies })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nesting::bombs;

    fn weigh(text: &str) -> Result<Weights, NestingError> {
        check_until(text.as_bytes(), &AtomicBool::new(false))
    }

    #[test]
    fn the_allowed_share_slides_from_99_to_10_percent_between_the_range_ends() {
        assert_eq!(allowed(0), 0.99);
        assert_eq!(allowed(RATIO_RANGE_LOW), 0.99);
        assert!(allowed(RATIO_RANGE_LOW + 1) < 0.99);
        let middle = (RATIO_RANGE_LOW + RATIO_RANGE_HIGH) / 2;
        assert!(
            (allowed(middle) - 0.545).abs() < 1e-9,
            "{}",
            allowed(middle)
        );
        assert!(allowed(RATIO_RANGE_HIGH - 1) > 0.10);
        assert_eq!(allowed(RATIO_RANGE_HIGH), 0.10);
        assert_eq!(allowed(u64::MAX), 0.10);
    }

    #[test]
    fn nothing_under_the_minimum_copies_or_total_is_refused_and_just_past_both_is() {
        // 99.9% copies, but a total at the minimum.
        assert!(!excessive(MIN_TOTAL - 100, MIN_TOTAL));
        assert!(excessive(MIN_TOTAL - 100, MIN_TOTAL + 1));
        // All copies, but no more than the minimum of them.
        assert!(!excessive(MIN_COPIES, MIN_COPIES));
        // Exactly 99% of a small total is allowed; a unit more is not.
        assert!(!excessive(990_000, 1_000_000));
        assert!(excessive(990_001, 1_000_000));
        // Past the range, 10%.
        let total = RATIO_RANGE_HIGH * 2;
        assert!(!excessive(total / 10, total));
        assert!(excessive(total / 10 + 1, total));
        // A saturated billion laughs.
        assert!(excessive(u64::MAX, u64::MAX));
    }

    #[test]
    fn a_copy_weighs_its_nodes_and_scalar_bytes_with_the_aliases_inside_it_expanded() {
        // {a: [1, 2], b: *a}: a weighs 100 + 2 × 101.
        assert_eq!(
            weigh("a: &a [1, 2]\nb: *a\n").unwrap(),
            Weights {
                own: 100 + 101 + 302 + 101 + 100,
                copies: 302
            }
        );
        // b holds two copies of a (201 each); c copies b with them.
        let b = 100 + 2 * 201;
        assert_eq!(
            weigh("a: &a [1]\nb: &b [*a, *a]\nc: *b\n").unwrap(),
            Weights {
                own: 100 + 101 + 201 + 101 + 100 + 2 * 100 + 101 + 100,
                copies: 2 * 201 + b
            }
        );
        // A scalar weighs its bytes; aliases to it the same.
        let w = 100 + 5;
        assert_eq!(
            weigh("[&s hello, *s, *s]").unwrap(),
            Weights {
                own: 100 + w + 2 * 100,
                copies: 2 * w
            }
        );
        // No aliases, no copies.
        assert_eq!(weigh("a: &a 1\n").unwrap().copies, 0);
    }

    /// `{a: &a <bytes × x>, b: [*a × copies]}`.
    fn flat(bytes: usize, copies: usize) -> String {
        format!(
            "{{a: &a {}, b: [{}]}}",
            "x".repeat(bytes),
            ["*a"; 1000][..copies].join(",")
        )
    }

    #[test]
    fn an_input_at_the_rule_s_edge_passes_and_one_more_alias_is_refused() {
        for bytes in [20_000u64, 1_000_000] {
            let anchored = NODE_WEIGHT + bytes;
            let own = |k: u64| 100 + 101 + anchored + 101 + 100 + k * NODE_WEIGHT;
            // The first number of aliases the rule refuses.
            let first = (1..1000)
                .find(|&k| excessive(k * anchored, own(k) + k * anchored))
                .expect("refused somewhere");
            let last_ok = first as usize - 1;
            assert_eq!(
                weigh(&flat(bytes as usize, last_ok)).unwrap(),
                Weights {
                    own: own(last_ok as u64),
                    copies: last_ok as u64 * anchored
                },
                "{bytes} bytes"
            );
            let err = weigh(&flat(bytes as usize, first as usize)).unwrap_err();
            assert!(matches!(err, NestingError::Aliasing { .. }), "{err:?}");
            eprintln!("{bytes} bytes: {last_ok} copies pass, {first} refused: {err}");
        }
    }

    #[test]
    fn issue_31_s_bombs_are_refused_and_a_billion_laughs_saturates_without_overflow() {
        for (name, bomb) in [
            ("wide", bombs::wide()),
            ("listed", bombs::listed()),
            ("laughs", bombs::laughs()),
        ] {
            let err = weigh(&bomb).unwrap_err();
            assert!(
                matches!(err, NestingError::Aliasing { .. }),
                "{name}: {err:?}"
            );
            // Through the one pre-parse check too.
            assert_eq!(crate::nesting::check(bomb.as_bytes()), Err(err.clone()));
            eprintln!("{name} ({} bytes): {err}", bomb.len());
        }
        assert_eq!(bombs::wide().len(), 1_874);
        // 64 levels of ten: 10^64 copies, past u64, saturated and refused.
        let mut text = String::from("l0: &l0 [x,x,x,x,x,x,x,x,x,x]\n");
        for level in 1..64 {
            let prev = format!("*l{}", level - 1);
            text += &format!("l{level}: &l{level} [{}]\n", [prev.as_str(); 10].join(","));
        }
        let err = weigh(&text).unwrap_err();
        assert!(matches!(err, NestingError::Aliasing { .. }), "{err:?}");
    }

    #[test]
    fn an_alias_inside_the_node_it_names_is_refused() {
        for text in ["a: &a [1, *a]\n", "a: &a {b: {c: *a}}\n", "&a [*a]"] {
            let err = weigh(text).unwrap_err();
            assert!(
                matches!(err, NestingError::RecursiveAlias { .. }),
                "{text}: {err:?}"
            );
        }
        let err = weigh("a: &a [1, *a]\n").unwrap_err();
        assert_eq!(
            err,
            NestingError::RecursiveAlias {
                line: 1,
                column: 11
            }
        );
    }

    #[test]
    fn a_name_defined_twice_then_a_new_one_is_refused_as_yaml_serde_would_copy_the_wrong_node() {
        // yaml_serde numbers the second `&a` and `&b` alike, and looks the
        // number up once the document is read: `c` copies b's node. A
        // small `&a` could so stand in for a large `&b` in the weighing.
        let text = "a: &a 1\nx: &a 2\nc: *a\nd: &b big\n";
        let read: yaml_serde::Value = yaml_serde::from_str(text).unwrap();
        assert_eq!(read["c"], "big", "yaml_serde's resolution this guards");
        let err = weigh(text).unwrap_err();
        assert_eq!(err, NestingError::RedefinedAnchor { line: 4, column: 4 });
    }

    #[test]
    fn a_name_redefined_with_no_new_name_after_it_passes_as_yaml_serde_reads_it_right() {
        let text = "a: &a 1\nb: *a\nc: &a 2\nd: *a\n";
        let read: yaml_serde::Value = yaml_serde::from_str(text).unwrap();
        assert_eq!((&read["b"], &read["d"]), (&1.into(), &2.into()));
        assert!(weigh(text).is_ok());
    }

    #[test]
    fn anchors_start_afresh_in_each_document() {
        // The second document's `*a` names nothing (yaml_serde refuses
        // it), so it weighs no copy of the first document's `a`.
        let text = format!("a: &a {}\n---\nb: [*a, *a, *a]\n", "x".repeat(100_000));
        assert_eq!(weigh(&text).unwrap().copies, 0);
    }

    #[test]
    fn ordinary_kubernetes_yaml_with_a_few_anchors_and_merge_keys_passes() {
        let text = r#"apiVersion: apiextensions.crossplane.io/v1
kind: Composition
metadata:
  name: buckets
  labels: &labels {app: buckets, team: storage, tier: backend}
spec:
  compositeTypeRef: {apiVersion: example.org/v1, kind: XBucket}
  mode: Pipeline
  pipeline:
  - step: patch
    functionRef: {name: function-patch-and-transform}
    input:
      apiVersion: pt.fn.crossplane.io/v1beta1
      kind: Resources
      patchSets:
      - name: common
        patches: &common
        - {type: FromCompositeFieldPath, fromFieldPath: spec.region, toFieldPath: spec.forProvider.region}
        - {type: FromCompositeFieldPath, fromFieldPath: metadata.labels, toFieldPath: metadata.labels}
      resources:
      - name: bucket
        base: &bucket
          apiVersion: s3.aws.upbound.io/v1beta1
          kind: Bucket
          metadata: {labels: *labels}
          spec: {forProvider: {region: us-east-1}, deletionPolicy: Delete}
        patches: *common
      - name: logs
        base:
          <<: *bucket
          metadata: {labels: {<<: *labels, role: logs}}
        patches: *common
      - name: backup
        base: {<<: *bucket}
        patches: *common
"#;
        let weights = weigh(text).unwrap();
        assert!(
            weights.copies > 0 && weights.copies < weights.own,
            "{weights:?}"
        );
        crate::nesting::check(text.as_bytes()).unwrap();
        // Large plain documents have no copies to weigh at all.
        let many = format!("items:\n{}", "- {a: [1, 2], b: text}\n".repeat(50_000));
        crate::nesting::check(many.as_bytes()).unwrap();
    }

    #[test]
    fn a_raised_flag_stops_the_weighing() {
        let long = format!("a: &a 1\nb: [{}]\n", "*a,".repeat(10_000));
        let stop = AtomicBool::new(true);
        assert_eq!(
            check_until(long.as_bytes(), &stop),
            Err(NestingError::Abandoned)
        );
    }
}
