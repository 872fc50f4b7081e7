//! `x-kubernetes-validations`: CEL rules run with the `cel` crate, `self`
//! the node's value. No old object exists here (a create), so transition
//! rules (those naming `oldSelf`) are skipped, with a note. A function the
//! crate lacks (Kubernetes' CEL libraries: lists, strings, quantity, url,
//! ip, format…) is an error naming it, never a pass.
//!
//! Bounds, checked before a rule runs: its length ([`MAX_RULE_BYTES`]),
//! bracket nesting ([`MAX_RULE_NESTING`]) and operators
//! ([`MAX_RULE_OPERATORS`]), which bound the parser's and the
//! interpreter's recursion; its estimated cost, the rule's node count times
//! the size of `self` (JSON nodes plus string bytes) to the power of its
//! comprehension nesting, against the API server's per-call limit
//! ([`PER_CALL_LIMIT`]), and all of a resource's rules together against
//! its per-object budget ([`PER_OBJECT_BUDGET`]). Nothing in CEL's
//! standard library costs more than linear time in its inputs, so the
//! estimate bounds the work.
use std::panic::{catch_unwind, AssertUnwindSafe};

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use cel::{Context, Program};
use serde_json::Value;

use super::Issue;

/// The longest rule evaluated.
pub(super) const MAX_RULE_BYTES: usize = 4096;
/// The deepest bracket nesting of a rule evaluated.
pub(super) const MAX_RULE_NESTING: usize = 32;
/// The most operators a rule evaluated has: a chain of them (`1+1+…`)
/// nests as deep as it is long in the `cel` crate's parser and
/// interpreter (cel-go refuses recursion past 250 for the same reason).
pub(super) const MAX_RULE_OPERATORS: usize = 250;
/// The estimated cost one rule may have (the API server's per-call limit).
pub(super) const PER_CALL_LIMIT: u64 = 1_000_000;
/// The estimated cost all rules of one resource may have together (the
/// API server's per-object budget, `RuntimeCELCostBudget`).
pub(super) const PER_OBJECT_BUDGET: u64 = 10_000_000;

/// Functions the `cel` crate's standard context has, and the macros it
/// expands.
const SUPPORTED: &[&str] = &[
    "contains",
    "size",
    "max",
    "min",
    "startsWith",
    "endsWith",
    "string",
    "bytes",
    "double",
    "int",
    "uint",
    "matches",
    "duration",
    "timestamp",
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
    "has",
    "all",
    "exists",
    "exists_one",
    "map",
    "filter",
    "optional.none",
    "optional.of",
    "optional.ofNonZeroValue",
    "value",
    "hasValue",
    "or",
    "orValue",
];

/// What is left of a resource's CEL budget.
#[derive(Debug)]
pub(super) struct Budget {
    left: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            left: PER_OBJECT_BUDGET,
        }
    }
}

impl Budget {
    /// Runs `rules` on `value` at `path`: the errors and the notes.
    pub(super) fn check(
        &mut self,
        value: &Value,
        rules: &[Value],
        path: &str,
    ) -> (Vec<Issue>, Vec<String>) {
        let mut issues = Vec::new();
        let mut notes = Vec::new();
        let shown_path = if path.is_empty() { "<root>" } else { path };
        for rule in rules {
            let Some(text) = rule.get("rule").and_then(Value::as_str) else {
                continue;
            };
            let rule_name = format!("x-kubernetes-validations rule {text:?}");
            let mut fail = |message: String, at: &str| {
                issues.push(Issue {
                    path: at.to_string(),
                    message,
                    rule: rule_name.clone(),
                });
            };
            if let Err(why) = within_bounds(text) {
                fail(format!("the rule was not evaluated: {why}"), path);
                continue;
            }
            let program = match compile(text) {
                Ok(program) => program,
                Err(error) => {
                    fail(format!("the rule does not compile: {error}"), path);
                    continue;
                }
            };
            let shape = Shape::of(program.expression());
            if shape.variables.iter().any(|v| v == "oldSelf") {
                notes.push(format!(
                    "{shown_path}: transition rule {text:?} skipped: it compares with the old object (oldSelf), and a validation has none"
                ));
                continue;
            }
            if let Some(function) = shape.functions.iter().find(|f| !supported(f)) {
                let what = if KUBERNETES_LIBRARY.contains(&function.as_str()) {
                    "a function of Kubernetes' CEL libraries that xfn cannot evaluate"
                } else {
                    "a function xfn does not know"
                };
                fail(
                    format!("the rule was not checked: it calls {function}(), {what}"),
                    path,
                );
                continue;
            }
            let size = size_of(value);
            let cost = shape
                .nodes
                .saturating_mul(size.saturating_pow(shape.comprehension_depth));
            if cost > PER_CALL_LIMIT {
                fail(
                    format!(
                        "the rule was not evaluated: its estimated cost {cost} exceeds the per-call limit {PER_CALL_LIMIT} ({} nodes, {} levels of comprehensions over a value of size {size})",
                        shape.nodes, shape.comprehension_depth
                    ),
                    path,
                );
                continue;
            }
            if cost > self.left {
                fail(
                    format!("the rule was not evaluated: the resource's rules exceed the per-object CEL budget {PER_OBJECT_BUDGET}"),
                    path,
                );
                continue;
            }
            self.left -= cost;
            let at = match rule.get("fieldPath").and_then(Value::as_str) {
                Some(field) => format!("{path}{}", field),
                None => path.to_string(),
            };
            let at = at.strip_prefix('.').unwrap_or(&at).to_string();
            match evaluate(&program, value) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => {
                    let message =
                        message_of(rule, value).unwrap_or_else(|| format!("failed rule: {text}"));
                    let shown = match value {
                        Value::Object(_) => "\"object\"".to_string(),
                        Value::Array(_) => "\"array\"".to_string(),
                        other => other.to_string(),
                    };
                    fail(format!("Invalid value: {shown}: {message}"), &at);
                }
                Ok(other) => fail(format!("the rule evaluated to {other:?}, not a bool"), &at),
                Err(error) => fail(format!("the rule could not be evaluated: {error}"), &at),
            }
        }
        (issues, notes)
    }
}

/// Why `text` is not evaluated at all, if it is too long or nests too deep.
fn within_bounds(text: &str) -> Result<(), String> {
    if text.len() > MAX_RULE_BYTES {
        return Err(format!(
            "it is {} bytes long, over the {MAX_RULE_BYTES} allowed",
            text.len()
        ));
    }
    let mut depth = 0usize;
    let mut operators = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in text.chars() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => {
                depth += 1;
                if depth > MAX_RULE_NESTING {
                    return Err(format!(
                        "it nests brackets more than {MAX_RULE_NESTING} deep"
                    ));
                }
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            '+' | '-' | '*' | '/' | '%' | '&' | '|' | '=' | '!' | '<' | '>' | '?' | '.' => {
                operators += 1;
                if operators > MAX_RULE_OPERATORS {
                    return Err(format!("it has more than {MAX_RULE_OPERATORS} operators"));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Most rules kept compiled (each at most [`MAX_RULE_BYTES`] of text and
/// its tree); past that a rule is compiled each time it runs.
const MAX_COMPILED: usize = 4096;

/// Rules compiled once per process, by their text: `xfn test` validates
/// every test's render against the same CRDs, and the `cel` crate's
/// parser costs more than most rules' evaluation.
static COMPILED: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Program>>>,
> = std::sync::LazyLock::new(Default::default);

fn compile(text: &str) -> Result<std::sync::Arc<Program>, String> {
    let compiled = || COMPILED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(program) = compiled().get(text) {
        return Ok(std::sync::Arc::clone(program));
    }
    let program = match catch_unwind(AssertUnwindSafe(|| Program::compile(text))) {
        Ok(Ok(program)) => std::sync::Arc::new(program),
        Ok(Err(errors)) => return Err(errors.to_string()),
        Err(_) => return Err("the CEL parser failed on it".into()),
    };
    let mut cache = compiled();
    if cache.len() < MAX_COMPILED {
        cache.insert(text.to_string(), std::sync::Arc::clone(&program));
    }
    Ok(program)
}

fn evaluate(program: &Program, value: &Value) -> Result<cel::Value, String> {
    let this = to_cel(value);
    catch_unwind(AssertUnwindSafe(|| {
        let mut context = Context::default();
        context.add_variable_from_value("self", this);
        program.execute(&context).map_err(|e| e.to_string())
    }))
    .unwrap_or_else(|_| Err("the CEL interpreter failed on it".into()))
}

/// The rule's message: its `messageExpression` when that evaluates to a
/// non-empty string (as the API server), else its `message`.
fn message_of(rule: &Value, value: &Value) -> Option<String> {
    if let Some(expression) = rule.get("messageExpression").and_then(Value::as_str) {
        let evaluated = within_bounds(expression)
            .ok()
            .and_then(|()| compile(expression).ok())
            .filter(|p| {
                let shape = Shape::of(p.expression());
                shape.functions.iter().all(|f| supported(f))
                    && shape
                        .nodes
                        .saturating_mul(size_of(value).saturating_pow(shape.comprehension_depth))
                        <= PER_CALL_LIMIT
            })
            .and_then(|p| evaluate(&p, value).ok());
        if let Some(cel::Value::String(s)) = evaluated {
            if !s.is_empty() {
                return Some(s.to_string());
            }
        }
    }
    rule.get("message")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
}

/// Kubernetes' CEL library functions (named in errors as such).
const KUBERNETES_LIBRARY: &[&str] = &[
    "isSorted",
    "sum",
    "indexOf",
    "lastIndexOf",
    "url",
    "isURL",
    "getScheme",
    "getHost",
    "getHostname",
    "getPort",
    "getEscapedPath",
    "getQuery",
    "ip",
    "isIP",
    "cidr",
    "isCIDR",
    "quantity",
    "isQuantity",
    "format",
    "lowerAscii",
    "upperAscii",
    "replace",
    "split",
    "join",
    "trim",
    "substring",
    "charAt",
    "reverse",
    "quote",
    "find",
    "findAll",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    "base64.encode",
    "base64.decode",
    "type",
    "dyn",
    "authorizer",
    "validator",
    "semver",
    "isSemver",
    "compareTo",
    "isLessThan",
    "isGreaterThan",
    "add",
    "sub",
    "asInteger",
    "asApproximateFloat",
    "sign",
    "isInteger",
    "family",
    "isUnspecified",
    "isLoopback",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isGlobalUnicast",
    "containsIP",
    "containsCIDR",
    "prefixLength",
    "masked",
    "getField",
];

fn supported(function: &str) -> bool {
    let operator = !function
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic());
    operator || SUPPORTED.contains(&function)
}

/// What a rule is made of: nodes, calls, variables, comprehension nesting.
#[derive(Debug, Default)]
struct Shape {
    nodes: u64,
    functions: Vec<String>,
    variables: Vec<String>,
    comprehension_depth: u32,
}

impl Shape {
    fn of(expression: &IdedExpr) -> Self {
        let mut shape = Shape::default();
        shape.visit(expression, 0);
        shape
    }

    fn visit(&mut self, expression: &IdedExpr, depth: u32) {
        self.nodes += 1;
        self.comprehension_depth = self.comprehension_depth.max(depth);
        match &expression.expr {
            Expr::Call(call) => {
                if !self.functions.contains(&call.func_name) {
                    self.functions.push(call.func_name.clone());
                }
                if let Some(target) = &call.target {
                    self.visit(target, depth);
                }
                for arg in &call.args {
                    self.visit(arg, depth);
                }
            }
            Expr::Comprehension(c) => {
                self.visit(&c.iter_range, depth);
                self.visit(&c.accu_init, depth);
                self.visit(&c.loop_cond, depth + 1);
                self.visit(&c.loop_step, depth + 1);
                self.visit(&c.result, depth);
            }
            Expr::Ident(name) => {
                if !self.variables.contains(name) {
                    self.variables.push(name.clone());
                }
            }
            Expr::List(list) => {
                for element in &list.elements {
                    self.visit(element, depth);
                }
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(e) = &entry.expr {
                        self.visit(&e.key, depth);
                        self.visit(&e.value, depth);
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        self.visit(&f.value, depth);
                    }
                }
            }
            Expr::Select(select) => self.visit(&select.operand, depth),
            Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
}

/// A JSON value as CEL sees it in Kubernetes: integers are `int` (serde
/// would make a non-negative one a `uint`, and `self.n % 2` would fail).
fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::String(s.clone().into()),
        Value::Array(items) => {
            cel::Value::List(items.iter().map(to_cel).collect::<Vec<_>>().into())
        }
        Value::Object(map) => {
            let map: std::collections::HashMap<cel::objects::Key, cel::Value> = map
                .iter()
                .map(|(k, v)| (cel::objects::Key::String(k.clone().into()), to_cel(v)))
                .collect();
            cel::Value::Map(map.into())
        }
    }
}

/// The size of a value for the cost estimate: its JSON nodes plus the
/// bytes of its strings and keys.
fn size_of(value: &Value) -> u64 {
    match value {
        Value::String(s) => 1 + s.len() as u64,
        Value::Array(items) => 1 + items.iter().map(size_of).sum::<u64>(),
        Value::Object(map) => {
            1 + map
                .iter()
                .map(|(k, v)| k.len() as u64 + size_of(v))
                .sum::<u64>()
        }
        _ => 1,
    }
}
