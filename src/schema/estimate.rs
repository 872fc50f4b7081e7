//! The API server's estimated cost of a CRD's CEL rules, checked when the
//! CRD is read: a rule whose estimate, times how many times its node can
//! occur, exceeds [`PER_RULE_LIMIT`], or rules whose sum exceeds
//! [`PER_CRD_LIMIT`], make the CRD one the API server refuses — an error,
//! never a pass.
//!
//! Invariant: the estimate is cel-go's (`checker/cost.go`) on the sizes
//! Kubernetes derives from the schema (`apiserver/pkg/cel/common/schemas.go`:
//! `maxLength` × 4 bytes, `maxItems`, `maxProperties`, or else as many as a
//! 3 MiB request holds), the multiplier Kubernetes' (`apiextensions`
//! `validation/cel_validation.go`: the product of the ancestors' `maxItems`
//! and `maxProperties`, or a 3 MiB request's worth when one is unbounded).
//! Costs of the Kubernetes and `ext` library functions that are not
//! cel-go's own are 1 plus a traversal of their target (a tenth per
//! element), as `library/cost.go` charges its string and list functions.
//! Why: `crossplane beta validate` runs rules on a CRD the cluster refuses.
use cel::common::ast::{operators, EntryExpr, Expr, IdedExpr, LiteralValue};
use serde_json::Value;

use super::typed::escape;

/// The largest estimated cost of one rule (apiextensions validation.go
/// `StaticEstimatedCostLimit`).
pub(super) const PER_RULE_LIMIT: u64 = 10_000_000;
/// The largest sum of the estimated costs of a CRD's rules
/// (`StaticEstimatedCRDCostLimit`).
pub(super) const PER_CRD_LIMIT: u64 = 100_000_000;
/// The API server's largest request (`celconfig.MaxRequestSizeBytes`).
const MAX_REQUEST: u64 = 3 * 1024 * 1024;
/// cel-go's `StringTraversalCostFactor`.
const TRAVERSAL: f64 = 0.1;
/// cel-go's `RegexStringLengthCostFactor`.
const REGEX: f64 = 0.25;

/// What the estimate knows of an expression's value.
#[derive(Debug, Clone, Copy, Default)]
struct Node<'a> {
    /// The estimated cost of computing it (cel-go's `Max`).
    cost: u64,
    /// Its size (characters, bytes, items, entries), when known.
    size: Option<u64>,
    /// Its schema, when it is `self`'s or reached from it.
    schema: Option<&'a Value>,
    /// It is a literal or built list (its items' size is `item`).
    item: Option<u64>,
}

/// `x × f`, rounded up, as cel-go's `multiplyByCostFactor`.
fn factor(x: u64, f: f64) -> u64 {
    let product = (x as f64 * f).ceil();
    if product >= u64::MAX as f64 {
        u64::MAX
    } else {
        product as u64
    }
}

/// The smallest JSON a value of `schema` serializes to (`MinSerializedSize`).
fn min_size(schema: &Value) -> u64 {
    if flag(schema, "x-kubernetes-int-or-string") {
        return 1;
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("boolean") => 4,
        Some("string") => match schema.get("format").and_then(Value::as_str) {
            Some("date") => 12,
            Some("date-time") => 22,
            Some("duration") => 4,
            _ => 2,
        },
        Some("object") if schema.get("additionalProperties").is_none() => {
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let properties = schema.get("properties").and_then(Value::as_object);
            2 + properties
                .into_iter()
                .flatten()
                .filter(|(name, p)| required.contains(&name.as_str()) && p.get("default").is_none())
                .map(|(name, p)| name.len() as u64 + min_size(p) + 4)
                .sum::<u64>()
        }
        Some("object" | "array") => 2,
        _ => 1,
    }
}

fn flag(schema: &Value, name: &str) -> bool {
    schema.get(name).and_then(Value::as_bool) == Some(true)
}

fn bound(schema: &Value, name: &str) -> Option<u64> {
    schema
        .get(name)
        .and_then(Value::as_i64)
        .map(|n| n.max(0) as u64)
}

/// The size Kubernetes gives a value of `schema` (its `MaxElements`), or
/// `None` for a scalar or an object with properties.
fn size_of(schema: &Value) -> Option<u64> {
    let unbounded_string = MAX_REQUEST - 2;
    if flag(schema, "x-kubernetes-int-or-string") {
        return Some(bound(schema, "maxLength").map_or(unbounded_string, |n| n * 4));
    }
    match schema.get("type").and_then(Value::as_str)? {
        "string" => match schema.get("format").and_then(Value::as_str) {
            Some("byte") => Some(bound(schema, "maxLength").unwrap_or(unbounded_string)),
            Some("date" | "date-time" | "duration") => None,
            _ => Some(match bound(schema, "maxLength") {
                Some(n) => n.saturating_mul(4),
                None => match schema.get("enum").and_then(Value::as_array) {
                    Some(values) if !values.is_empty() => values
                        .iter()
                        .filter_map(Value::as_str)
                        .map(|s| s.len() as u64)
                        .max()
                        .unwrap_or(0),
                    _ => unbounded_string,
                },
            }),
        },
        "array" => {
            let items = schema.get("items")?;
            Some(
                bound(schema, "maxItems")
                    .unwrap_or_else(|| (MAX_REQUEST - 2) / (min_size(items) + 1)),
            )
        }
        "object" => {
            let values = schema.get("additionalProperties")?;
            Some(
                bound(schema, "maxProperties")
                    .unwrap_or_else(|| (MAX_REQUEST - 2) / (min_size(values) + 6)),
            )
        }
        _ => None,
    }
}

/// The value of `schema` as a node.
fn of_schema(schema: &Value) -> Node<'_> {
    Node {
        cost: 1,
        size: size_of(schema),
        schema: Some(schema),
        item: None,
    }
}

/// The schema of the field `field` (as a rule names it, escaped) of an
/// object of `schema`, or of a map's values.
fn field_schema<'a>(schema: &'a Value, field: &str) -> Option<&'a Value> {
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        if let Some((_, p)) = properties
            .iter()
            .find(|(name, _)| escape(name).as_deref() == Some(field))
        {
            return Some(p);
        }
    }
    schema.get("additionalProperties").filter(|a| a.is_object())
}

/// The schema of an element a comprehension over `range` binds: a list's
/// items; a map's keys (strings) — or values for a second variable.
fn element_schema(range: &Value, second: bool) -> Option<&Value> {
    match range.get("type").and_then(Value::as_str) {
        Some("array") => range.get("items"),
        Some("object") if second => range.get("additionalProperties"),
        Some("object") => Some(&STRING),
        _ => None,
    }
}

static STRING: std::sync::LazyLock<Value> =
    std::sync::LazyLock::new(|| serde_json::json!({"type": "string"}));

/// The estimator's scope: `self` (and `oldSelf`), and the comprehension
/// variables bound around the expression.
struct Scope<'a> {
    this: &'a Value,
    variables: Vec<(String, Node<'a>)>,
}

impl<'a> Scope<'a> {
    fn ident(&self, name: &str) -> Node<'a> {
        if let Some((_, node)) = self.variables.iter().rev().find(|(n, _)| n == name) {
            return Node { cost: 1, ..*node };
        }
        if name == "self" || name == "oldSelf" {
            return of_schema(self.this);
        }
        Node {
            cost: 1,
            ..Node::default()
        }
    }

    fn all(&mut self, parts: &[&IdedExpr]) -> u64 {
        parts
            .iter()
            .fold(0u64, |cost, part| cost.saturating_add(self.cost(part).cost))
    }

    /// cel-go's `coster.cost`: the node's estimated cost and what it knows
    /// of its value.
    fn cost(&mut self, expression: &IdedExpr) -> Node<'a> {
        match &expression.expr {
            Expr::Literal(literal) => Node {
                cost: 0,
                size: Some(match literal {
                    LiteralValue::String(s) => s.chars().count() as u64,
                    LiteralValue::Bytes(b) => b.len() as u64,
                    _ => 1,
                }),
                ..Node::default()
            },
            Expr::Unspecified => Node::default(),
            Expr::Ident(name) => self.ident(name),
            Expr::Select(select) => {
                let operand = self.cost(&select.operand);
                if select.test {
                    return Node {
                        cost: operand.cost.saturating_add(1),
                        ..Node::default()
                    };
                }
                let schema = operand.schema.and_then(|s| field_schema(s, &select.field));
                Node {
                    cost: operand.cost.saturating_add(1),
                    ..schema.map(of_schema).unwrap_or_default()
                }
            }
            Expr::List(list) => {
                let mut cost = 10u64;
                let mut item = 0u64;
                for element in &list.elements {
                    let node = self.cost(element);
                    cost = cost.saturating_add(node.cost);
                    item = item.max(node.size.unwrap_or(1));
                }
                Node {
                    cost,
                    size: Some(list.elements.len() as u64),
                    schema: None,
                    item: Some(item),
                }
            }
            Expr::Map(map) => {
                let parts: Vec<&IdedExpr> = map
                    .entries
                    .iter()
                    .flat_map(|entry| match &entry.expr {
                        EntryExpr::MapEntry(e) => vec![&e.key, &e.value],
                        EntryExpr::StructField(f) => vec![&f.value],
                    })
                    .collect();
                Node {
                    cost: 30u64.saturating_add(self.all(&parts)),
                    size: Some(map.entries.len() as u64),
                    ..Node::default()
                }
            }
            Expr::Struct(s) => {
                let parts: Vec<&IdedExpr> = s
                    .entries
                    .iter()
                    .filter_map(|entry| match &entry.expr {
                        EntryExpr::StructField(f) => Some(&f.value),
                        EntryExpr::MapEntry(_) => None,
                    })
                    .collect();
                Node {
                    cost: 40u64.saturating_add(self.all(&parts)),
                    ..Node::default()
                }
            }
            Expr::Comprehension(c) => {
                let range = self.cost(&c.iter_range);
                let init = self.cost(&c.accu_init);
                let element = |second: bool| match range.schema {
                    Some(s) => element_schema(s, second).map(of_schema).unwrap_or_default(),
                    None => Node {
                        size: range.item,
                        ..Node::default()
                    },
                };
                let mut bound = vec![(c.iter_var.clone(), element(false))];
                if let Some(second) = &c.iter_var2 {
                    bound.push((second.clone(), element(true)));
                }
                bound.push((c.accu_var.clone(), init));
                let depth = self.variables.len();
                self.variables.extend(bound);
                let each = self
                    .cost(&c.loop_cond)
                    .cost
                    .saturating_add(self.cost(&c.loop_step).cost);
                self.variables.truncate(depth);
                self.variables.push((c.accu_var.clone(), init));
                let result = self.cost(&c.result);
                self.variables.truncate(depth);
                let count = range.size.unwrap_or(u64::MAX);
                Node {
                    cost: range
                        .cost
                        .saturating_add(init.cost)
                        .saturating_add(result.cost)
                        .saturating_add(count.saturating_mul(each)),
                    size: match &c.accu_init.expr {
                        Expr::List(_) | Expr::Map(_) => Some(count),
                        _ => result.size,
                    },
                    ..Node::default()
                }
            }
            Expr::Call(call) => self.call(call),
        }
    }

    /// cel-go's `functionCost` for its own overloads; 1 plus a traversal
    /// of the target for the libraries'.
    fn call(&mut self, call: &cel::common::ast::CallExpr) -> Node<'a> {
        let target = call.target.as_deref().map(|t| self.cost(t));
        let args: Vec<Node<'a>> = call.args.iter().map(|a| self.cost(a)).collect();
        let arguments = args
            .iter()
            .chain(&target)
            .fold(0u64, |sum, a| sum.saturating_add(a.cost));
        let size = |n: Option<&Node>| n.and_then(|n| n.size).unwrap_or(u64::MAX);
        let plain = |cost: u64| Node {
            cost: cost.saturating_add(arguments),
            ..Node::default()
        };
        let string_like = |n: &Node| {
            n.schema
                .is_some_and(|s| s.get("type").and_then(Value::as_str) == Some("string"))
                || (n.item.is_none() && n.schema.is_none() && n.size.is_some())
        };
        match call.func_name.as_str() {
            operators::LOGICAL_AND | operators::LOGICAL_OR => Node {
                cost: args.iter().fold(0u64, |sum, a| sum.saturating_add(a.cost)),
                ..Node::default()
            },
            operators::CONDITIONAL if args.len() == 3 => Node {
                cost: args[0].cost.saturating_add(args[1].cost.max(args[2].cost)),
                size: Some(size(args.get(1)).max(size(args.get(2)))),
                ..Node::default()
            },
            operators::ADD | super::check::SET_ADD if args.len() == 2 => {
                let total = size(args.first()).saturating_add(size(args.get(1)));
                let list = args[0].item.is_some()
                    || args[0]
                        .schema
                        .is_some_and(|s| s.get("type").and_then(Value::as_str) == Some("array"));
                let string = !list && string_like(&args[0]);
                let scalar = !list && !string;
                Node {
                    cost: if string {
                        factor(total, TRAVERSAL).saturating_add(arguments)
                    } else {
                        arguments.saturating_add(1)
                    },
                    size: (!scalar).then_some(total),
                    schema: if list { args[0].schema } else { None },
                    item: if list { args[0].item } else { None },
                }
            }
            operators::EQUALS
            | operators::NOT_EQUALS
            | operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS
            | super::check::SET_EQUALS
                if args.len() == 2 =>
            {
                // A value of no known size (a type, a number a function
                // returned) is a scalar: 1.
                let known = |n: Option<&Node>| n.and_then(|n| n.size).unwrap_or(1);
                let smallest = known(args.first()).min(known(args.get(1)));
                plain(factor(smallest, TRAVERSAL))
            }
            operators::IN if args.len() == 2 => plain(size(args.get(1))),
            "matches" | "find" | "findAll" => {
                let (text, pattern) = match (&target, args.as_slice()) {
                    (Some(t), [p, ..]) => (size(Some(t)), size(Some(p))),
                    (None, [t, p, ..]) => (size(Some(t)), size(Some(p))),
                    _ => (u64::MAX, u64::MAX),
                };
                let text = factor(text.saturating_add(1), TRAVERSAL);
                plain(text.saturating_mul(factor(pattern, REGEX)))
            }
            "contains" if target.as_ref().is_some_and(string_like) && args.len() == 1 => {
                let text = factor(size(target.as_ref()), TRAVERSAL);
                plain(text.saturating_mul(factor(size(args.first()), TRAVERSAL)))
            }
            "startsWith" | "endsWith" if args.len() == 1 => {
                plain(factor(size(args.first()), TRAVERSAL))
            }
            "dyn" if args.len() == 1 => Node {
                cost: args[0].cost.saturating_add(1),
                ..args[0]
            },
            "size"
            | "int"
            | "uint"
            | "double"
            | "bool"
            | "type"
            | "timestamp"
            | "duration"
            | operators::NOT_STRICTLY_FALSE
            | operators::INDEX
            | operators::LOGICAL_NOT
            | operators::NEGATE
            | operators::SUBSTRACT
            | operators::MULTIPLY
            | operators::DIVIDE
            | operators::MODULO => {
                let indexed = (call.func_name == operators::INDEX)
                    .then(|| args.first().and_then(|a| a.schema))
                    .flatten()
                    .and_then(|s| element_schema(s, true).or_else(|| s.get("items")));
                Node {
                    cost: arguments.saturating_add(1),
                    ..indexed.map(of_schema).unwrap_or_default()
                }
            }
            // The libraries' functions: a traversal of their target, and
            // of a string their result is as large as.
            _ => {
                let over = target.as_ref().or(args.first());
                let traversal = over
                    .and_then(|o| o.size)
                    .map_or(1, |s| factor(s, TRAVERSAL).max(1));
                Node {
                    cost: arguments.saturating_add(traversal),
                    size: over.filter(|o| string_like(o)).and_then(|o| o.size),
                    ..Node::default()
                }
            }
        }
    }
}

/// The estimated cost of `rule` (checked) on a `self` of `schema`
/// (cel-go's `Max`).
pub(super) fn rule_cost(rule: &IdedExpr, schema: &Value) -> u64 {
    Scope {
        this: schema,
        variables: Vec::new(),
    }
    .cost(rule)
    .cost
}

/// How an exceeded estimate is said: the API server's words
/// (apiextensions validation.go `getCostErrorMessage`).
pub(super) fn exceeds(what: &str, cost: u64, limit: u64) -> String {
    let by = cost as f64 / limit as f64;
    let factor = if by > 100.0 {
        "more than 100x".to_string()
    } else if by < 1.5 {
        format!("{by:.6}x")
    } else {
        format!("{by:.1}x")
    };
    format!("{what} exceeds budget by factor of {factor} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)")
}

/// One rule of a schema, estimated: where it is, its text, its cost with
/// its node's multiplier.
pub(super) struct Estimated {
    pub(super) path: String,
    pub(super) rule: String,
    pub(super) cost: u64,
}

/// Every rule of `schema` (an `openAPIV3Schema`) estimated, `compile`
/// turning a rule's text and its node's schema into its checked tree (or
/// `None` when it does not compile: that is reported where it runs).
pub(super) fn rules(
    schema: &Value,
    compile: &dyn Fn(&str, &Value, bool) -> Option<IdedExpr>,
) -> Vec<Estimated> {
    let mut found = Vec::new();
    walk(
        schema,
        "openAPIV3Schema",
        Some(1),
        true,
        compile,
        &mut found,
    );
    found
}

fn walk(
    schema: &Value,
    path: &str,
    cardinality: Option<u64>,
    root: bool,
    compile: &dyn Fn(&str, &Value, bool) -> Option<IdedExpr>,
    found: &mut Vec<Estimated>,
) {
    let Some(object) = schema.as_object() else {
        return;
    };
    if let Some(rules) = object
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        // Unbounded: as many as a request holds (compilation.go `maxCardinality`).
        let times = cardinality.unwrap_or(MAX_REQUEST / (min_size(schema) + 1));
        for (i, rule) in rules.iter().enumerate() {
            let Some(text) = rule.get("rule").and_then(Value::as_str) else {
                continue;
            };
            let Some(tree) = compile(text, schema, root) else {
                continue;
            };
            found.push(Estimated {
                path: format!("{path}.x-kubernetes-validations[{i}].rule"),
                rule: text.to_string(),
                cost: rule_cost(&tree, schema).saturating_mul(times),
            });
        }
    }
    // How many times a child can occur per occurrence of this node
    // (cel_validation.go `extractMaxElements`).
    let children = |max: Option<u64>| cardinality.zip(max).map(|(c, m)| c.saturating_mul(m));
    let is = |ty: &str| object.get("type").and_then(Value::as_str) == Some(ty);
    if let Some(properties) = object.get("properties").and_then(Value::as_object) {
        let times = if is("object") && object.contains_key("additionalProperties") {
            children(bound(schema, "maxProperties"))
        } else {
            cardinality
        };
        for (name, property) in properties {
            let embedded = flag(property, "x-kubernetes-embedded-resource");
            walk(
                property,
                &format!("{path}.properties[{name}]"),
                times,
                embedded,
                compile,
                found,
            );
        }
    }
    if let Some(items) = object.get("items") {
        let times = children(if is("array") {
            bound(schema, "maxItems")
        } else {
            Some(1)
        });
        let embedded = flag(items, "x-kubernetes-embedded-resource");
        walk(
            items,
            &format!("{path}.items"),
            times,
            embedded,
            compile,
            found,
        );
    }
    if let Some(values) = object.get("additionalProperties").filter(|a| a.is_object()) {
        let times = children(bound(schema, "maxProperties"));
        let embedded = flag(values, "x-kubernetes-embedded-resource");
        walk(
            values,
            &format!("{path}.additionalProperties"),
            times,
            embedded,
            compile,
            found,
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::{rule_cost, PER_RULE_LIMIT};

    /// The estimated cost of `rule` on a `self` of `schema`, by cel-go's
    /// rules on Kubernetes' sizes.
    fn cost(rule: &str, schema: Value) -> u64 {
        let tree = super::super::cel::checked(rule, &schema, false).expect("compiles");
        rule_cost(&tree, &schema)
    }

    #[test]
    fn scalars_cost_their_nodes_and_constants_nothing() {
        // size() 1 + self 1; `<` of ints 1 (a tenth of size 1, rounded up).
        assert_eq!(
            cost(
                "self.size() < 10",
                json!({"type": "string", "maxLength": 10})
            ),
            3
        );
        // select 1 + self 1; `==` 1.
        let object = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        assert_eq!(cost("self.n == 1", object.clone()), 3);
        // has(): the presence test 1 + self 1, no select.
        assert_eq!(cost("has(self.n)", object), 2);
    }

    #[test]
    fn a_string_comparison_traverses_the_shorter_side_at_a_tenth_a_byte() {
        // maxLength 100 is 400 bytes (4 a character): min(400, 3) / 10 → 1.
        assert_eq!(
            cost("self == 'abc'", json!({"type": "string", "maxLength": 100})),
            2
        );
        // Two fields of 400 bytes: 40.
        let two = json!({"type": "object", "properties": {
            "a": {"type": "string", "maxLength": 100}, "b": {"type": "string", "maxLength": 100}}});
        assert_eq!(cost("self.a == self.b", two.clone()), 44);
        // Their concatenation: 800 bytes traversed, 80; compared with
        // '' (size 0): nothing.
        assert_eq!(cost("self.a + self.b == ''", two), 4 + 80);
    }

    #[test]
    fn a_comprehension_costs_its_body_once_per_item_the_schema_allows() {
        let list = |max: Option<u64>| {
            let mut schema = json!({"type": "array", "items": {"type": "string", "maxLength": 64}});
            if let Some(max) = max {
                schema["maxItems"] = json!(max);
            }
            schema
        };
        // self 1, the result (accu) 1, and per item: the condition
        // @not_strictly_false(accu) 2, the step accu && x.startsWith('a'):
        // accu 1, x 1, a tenth of 'a' 1 (`&&` and startsWith add nothing).
        assert_eq!(
            cost("self.all(x, x.startsWith('a'))", list(Some(10))),
            1 + 10 * 5 + 1
        );
        // Without maxItems: as many as 3 MiB holds ("" and a comma each).
        assert_eq!(
            cost("self.all(x, x.startsWith('a'))", list(None)),
            1 + (3 * 1024 * 1024 - 2) / 3 * 5 + 1
        );
    }

    #[test]
    fn an_unbounded_list_of_unbounded_strings_matched_by_a_regex_is_over_the_limit() {
        let unbounded = json!({"type": "array", "items": {"type": "string"}});
        assert!(cost("self.all(x, x.matches('^[a-z]*$'))", unbounded) > 100 * PER_RULE_LIMIT);
        let bounded = json!({"type": "array", "maxItems": 10,
            "items": {"type": "string", "maxLength": 64}});
        // matches: (256 + 1) / 10 → 26 times 8 / 4 → 2, plus x.
        assert_eq!(
            cost("self.all(x, x.matches('^[a-z]*$'))", bounded),
            1 + 10 * (2 + 1 + (1 + 26 * 2)) + 1
        );
    }

    #[test]
    fn nested_comprehensions_multiply() {
        let nested = json!({"type": "array", "maxItems": 100, "items": {
            "type": "array", "maxItems": 100, "items": {"type": "integer"}}});
        // Inner per item: 2 + (1 + (n 1 + `>` 1)) = 5, so 1 + 500 + 1;
        // outer per item: 2 + 1 + 502 = 505.
        assert_eq!(
            cost("self.all(l, l.all(n, n > 0))", nested),
            1 + 100 * 505 + 1
        );
    }
}
