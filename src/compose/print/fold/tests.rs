use super::*;
use serde_json::Value;

/// What the XR below printed as by `crossplane render -x` (CLI v2.5.0, core
/// v2.3.4 as `--crossplane-binary`; run once on 2026-11-29, the `spec`
/// part): go-yaml v2's folding, as facts. tests/render_peers.rs checks the
/// same against the CLI itself, when it runs.
const CLI_PRINTED: &str = r###"spec:
  ctrl: "\x01 control word word word word word word word word word word word word
    word word word word word word word word"
  double: "tab\there and then word word word word word word word word word word word
    word word word word word word word word word"
  doublespaces: "start\txxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx
    \ two  spaces  word word word word word word word word word word"
  edge80: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
    b c d e f g h i j k
  edge81: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
    b c d e f g h i j k
  edge82: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
    b c d e f g h i j k
  hash: 'a #comment like word word word word word word word word word word word word
    word word word word word word word word'
  ? kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk
  : long key value word word word word word word word word word word word word word
    word word word word word word word
  list:
  - item word word word word word word word word word word word word word word word
    word word word word word
  - - nested item word word word word word word word word word word word word word
      word word word word word word word
  - inner: deep value word word word word word word word word word word word word
      word word word word word word word word
    more:
    - x: deeper word word word word word word word word word word word word word word
        word word word word word word word word word word word
  lit: |
    line one
    line two word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word
  longword: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
  longwords: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
    bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
    cccccccccc
  multibyte: 'éééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééé
    ünïcödé 日本語 日本語 日本語 日本語 日本語 日本語 日本語 日本語 日本語 日本語 '
  plain: the quick brown fox jumps over the lazy dog and keeps on running far far
    away from here and there
  plain2: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx yyyyyyyyyyyyyyyyyyyy
    zzzzzzzzzzzzzzzzzzzzzzzzzzzzzz end
  plainspaces: yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy  two  spaces  word
    word word word word word word word word word
  quoted11: "1_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000"
  single: 'Unready resources: sample-access-key-0, sample-access-key-1, test-user-0,
    and 1 more things here'
  singlequote: 'it''s: don''t stop don''t stop don''t stop don''t stop don''t stop
    don''t stop don''t stop don''t stop don''t stop don''t stop don''t stop don''t
    stop '
  singlespaces: 'z: yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy  two  spaces  word
    word word word word word word word word word'
  trail: ' leading and trailing w w w w w w w w w w w w w w w w w w w w w w w w w
    w w w w w w w w w w w w w w w  '
"###;

const SPEC: &str = r###"{"spec": {"ctrl": "\u0001 control word word word word word word word word word word word word word word word word word word word word", "double": "tab\there and then word word word word word word word word word word word word word word word word word word word word", "doublespaces": "start\txxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx  two  spaces  word word word word word word word word word word", "edge80": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa b c d e f g h i j k", "edge81": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa b c d e f g h i j k", "edge82": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa b c d e f g h i j k", "hash": "a #comment like word word word word word word word word word word word word word word word word word word word word", "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk": "long key value word word word word word word word word word word word word word word word word word word word word", "list": ["item word word word word word word word word word word word word word word word word word word word word", ["nested item word word word word word word word word word word word word word word word word word word word word"], {"inner": "deep value word word word word word word word word word word word word word word word word word word word word", "more": [{"x": "deeper word word word word word word word word word word word word word word word word word word word word word word word word word"}]}], "lit": "line one\nline two word word word word word word word word word word word word word word word word word word word word word word word word word word word word word word\n", "longword": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "longwords": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb cccccccccc", "multibyte": "éééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééé ünïcödé 日本語 日本語 日本語 日本語 日本語 日本語 日本語 日本語 日本語 日本語 ", "plain": "the quick brown fox jumps over the lazy dog and keeps on running far far away from here and there", "plain2": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx yyyyyyyyyyyyyyyyyyyy zzzzzzzzzzzzzzzzzzzzzzzzzzzzzz end", "plainspaces": "yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy  two  spaces  word word word word word word word word word word", "quoted11": "1_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000", "single": "Unready resources: sample-access-key-0, sample-access-key-1, test-user-0, and 1 more things here", "singlequote": "it's: don't stop don't stop don't stop don't stop don't stop don't stop don't stop don't stop don't stop don't stop don't stop don't stop ", "singlespaces": "z: yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy  two  spaces  word word word word word word word word word word", "trail": " leading and trailing w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w w  "}}"###;

fn printed(value: &Value) -> String {
    crate::compose::print::yaml11::to_string(value).unwrap()
}

#[test]
fn long_scalars_fold_where_the_clis_go_yaml_folds_them() {
    let spec: Value = serde_json::from_str(SPEC).unwrap();
    let text = printed(&spec);
    for (ours, cli) in text.lines().zip(CLI_PRINTED.lines()) {
        assert_eq!(ours, cli);
    }
    assert_eq!(text, CLI_PRINTED);
}

#[test]
fn folded_scalars_read_back_as_the_same_strings() {
    let spec: Value = serde_json::from_str(SPEC).unwrap();
    let back: Value = yaml_serde::from_str(&printed(&spec)).unwrap();
    assert_eq!(back, spec);
}

#[test]
fn short_lines_keys_and_literal_blocks_are_left_as_they_are() {
    let text = "a: short value\nlong-key-name-that-is-long-but-a-key-all-the-same-so-it-is-never-broken-at-all:\n  \
                b: |\n    a literal line long enough to pass the width of eighty columns by some way\n";
    assert_eq!(fold(text), text);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    #[test]
    fn any_folded_document_reads_back_as_the_same_value(
        words in proptest::collection::vec(
            "[a-z]{0,12}|[ ]{1,3}|[\\t'\":#é日-]|\\\\|\n|\r|\u{2028}", 0..60),
        depth in 0usize..4,
        key_len in 1usize..140,
        in_list in proptest::bool::ANY,
    ) {
        let s: String = words.concat();
        let mut value = serde_json::json!({ "k".repeat(key_len): s.clone(), "v": s });
        for _ in 0..depth {
            value = if in_list { serde_json::json!([value, "x"]) } else { serde_json::json!({"nested": value}) };
        }
        let text = printed(&value);
        let back: Value = yaml_serde::from_str(&text).unwrap();
        proptest::prop_assert_eq!(back, value, "{}", text);
    }
}
