//! `x-kubernetes-validations`: CEL rules run with the `cel` crate and
//! Kubernetes' CEL libraries from `kube-cel` ([`meter::context`]), `self` the
//! node's value typed by its schema as the API server types it ([`typed`],
//! converted once for all its rules). A rule is checked against the declared
//! type of `self` first ([`check`]): what cel-go's checker refuses in a CRD
//! is an error, never a pass. Transition rules (those naming `oldSelf`)
//! run against the old value when the resource has an old version, and
//! are skipped with a note otherwise (unless `optionalOldSelf`).
//!
//! Bounds, checked before a rule runs: its length ([`MAX_RULE_BYTES`]),
//! bracket nesting ([`MAX_RULE_NESTING`]) and operators
//! ([`MAX_RULE_OPERATORS`]), which bound the parser's and the
//! interpreter's recursion; its estimated cost ([`estimate`], from the
//! sizes of `self` as the API server's estimator reckons) against the
//! per-call limit ([`PER_CALL_LIMIT`]). The estimate is a first refusal,
//! with the API server's words; what bounds the work is the runtime cost
//! ([`meter`]): a rule stops past the per-call limit, or once a resource's
//! rules have spent the per-object budget ([`PER_OBJECT_BUDGET`]), and no
//! rule of that resource runs after a stop. A stopped rule is an error.
use std::panic::{catch_unwind, AssertUnwindSafe};

use cel::common::ast::{operators, EntryExpr, Expr, IdedExpr};
use cel::Program;
use serde_json::Value;

use super::check::check;
use super::meter;
use super::typed::{self, Ty};
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

/// What is left of a resource's CEL budget.
#[derive(Debug)]
pub(super) struct Budget {
    left: u64,
    /// A rule was stopped: no further rule runs, as in the API server.
    stopped: bool,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            left: PER_OBJECT_BUDGET,
            stopped: false,
        }
    }
}

impl Budget {
    /// Runs `rules` on `value` at `path`, `old` its old value when the
    /// resource has an old version that holds one: the errors and the
    /// notes. `ratcheting` (`value` is unchanged, or within an unchanged
    /// value): only transition rules run, as in the API server.
    pub(super) fn check(
        &mut self,
        value: &Value,
        old: Option<&Value>,
        schema: &Value,
        rules: &[Value],
        path: &str,
        ratcheting: bool,
    ) -> (Vec<Issue>, Vec<String>) {
        let mut issues = Vec::new();
        let mut notes = Vec::new();
        if self.stopped || rules.is_empty() {
            return (issues, notes);
        }
        let shown_path = if path.is_empty() { "<root>" } else { path };
        // `self`, typed, converted and sized once for all the node's rules.
        let this = if path.is_empty() {
            typed::declared_resource(schema)
        } else {
            typed::declared(schema).unwrap_or(Ty::Dyn)
        };
        let context = meter::context(typed::value(value, schema));
        let old = old.map(|old| typed::value(old, schema));
        let sizes = size_of(value);
        for rule in rules {
            if self.stopped {
                break;
            }
            let Some(text) = rule.get("rule").and_then(Value::as_str) else {
                continue;
            };
            let rule_name = format!("x-kubernetes-validations rule {text:?}");
            let mut fail = |message: String, at: &str| {
                // One line per finding: the parser's errors show the rule
                // over several lines, with a caret.
                let message = if message.contains('\n') {
                    message.split_whitespace().collect::<Vec<_>>().join(" ")
                } else {
                    message
                };
                issues.push(Issue {
                    path: at.to_string(),
                    message,
                    rule: rule_name.clone(),
                });
            };
            let optional = rule.get("optionalOldSelf") == Some(&Value::Bool(true));
            let compiled = match compile(text, &this, &Ty::Bool, optional) {
                Ok(compiled) => compiled,
                Err(error) => {
                    fail(error, path);
                    continue;
                }
            };
            let transition = compiled.shape.variables.iter().any(|v| v == "oldSelf");
            if ratcheting && !transition {
                continue;
            }
            // `oldSelf`: the old value, optional with `optionalOldSelf`
            // (then the rule runs without one too); a transition rule
            // without it does not run (apiextensions-apiserver
            // `schema/cel/validation.go`).
            let old_self = match (&old, optional) {
                (Some(old), false) => Some(old.clone()),
                (old, true) => Some(cel::Value::Opaque(std::sync::Arc::new(match old {
                    Some(old) => cel::objects::OptionalValue::of(old.clone()),
                    None => cel::objects::OptionalValue::none(),
                }))),
                (None, false) => None,
            };
            if transition && old_self.is_none() {
                notes.push(format!(
                    "{shown_path}: transition rule {text:?} skipped: it compares with the old object (oldSelf), and there is none here (give it with --old-resources)"
                ));
                continue;
            }
            let mut scope = context.new_inner_scope();
            if let Some(old_self) = old_self.filter(|_| transition) {
                scope.add_variable_from_value("oldSelf", old_self);
            }
            let context = &scope;
            let (cost, _) = estimate(&compiled.expression, &sizes);
            if cost > PER_CALL_LIMIT {
                fail(
                    format!(
                        "the rule was not evaluated: estimated rule cost exceeds budget by factor of {:.1} (estimated {cost} on this value of size {}, over the per-call limit {PER_CALL_LIMIT}; try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)",
                        cost as f64 / PER_CALL_LIMIT as f64,
                        sizes.size,
                    ),
                    path,
                );
                continue;
            }
            let at = match rule.get("fieldPath").and_then(Value::as_str) {
                Some(field) => format!("{path}{}", field),
                None => path.to_string(),
            };
            let at = at.strip_prefix('.').unwrap_or(&at).to_string();
            match self.run(&compiled, context, text) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => {
                    let message = self
                        .message_of(rule, context, sizes, &this, optional)
                        .unwrap_or_else(|| format!("failed rule: {text}"));
                    let shown = match value {
                        Value::Object(_) => "\"object\"".to_string(),
                        Value::Array(_) => "\"array\"".to_string(),
                        other => other.to_string(),
                    };
                    fail(format!("Invalid value: {shown}: {message}"), &at);
                }
                Ok(other) => fail(
                    format!(
                        "the rule evaluated to {}, not a bool",
                        shorten(&format!("{other:?}"))
                    ),
                    &at,
                ),
                Err(Stop::Error(error)) => fail(
                    format!("the rule could not be evaluated: {}", shorten(&error)),
                    &at,
                ),
                Err(Stop::Spent(why)) => fail(why, &at),
            }
        }
        (issues, notes)
    }

    /// Runs a rule within the per-call limit and what is left of the
    /// per-object budget, and takes what it spent from the budget; a stop
    /// is said in the API server's words, and no rule runs after it.
    fn run(
        &mut self,
        compiled: &Compiled,
        context: &cel::Context,
        text: &str,
    ) -> Result<cel::Value, Stop> {
        let limit = PER_CALL_LIMIT.min(self.left);
        let run = meter::run(&compiled.instrumented, context, limit);
        self.left = self.left.saturating_sub(run.spent);
        if run.stopped {
            self.stopped = true;
            return Err(Stop::Spent(if limit < PER_CALL_LIMIT {
                format!("validation failed due to running out of cost budget, no further validation rules will be run (the resource's rules spent its budget of {PER_OBJECT_BUDGET})")
            } else {
                format!("'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: {text} (its cost passed {PER_CALL_LIMIT} while it ran)")
            }));
        }
        run.value.map_err(Stop::Error)
    }

    /// The rule's message: its `messageExpression` when that evaluates to a
    /// non-empty string (as the API server), else its `message`.
    fn message_of(
        &mut self,
        rule: &Value,
        context: &cel::Context,
        sizes: Sizes,
        this: &Ty,
        optional: bool,
    ) -> Option<String> {
        if let Some(expression) = rule.get("messageExpression").and_then(Value::as_str) {
            let evaluated = compile(expression, this, &Ty::String, optional)
                .ok()
                .filter(|c| estimate(&c.expression, &sizes).0 <= PER_CALL_LIMIT)
                .and_then(|c| self.run(&c, context, expression).ok());
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
}

/// An error or a value as a finding shows it: the interpreter's errors name
/// values, which may be megabytes; cut after 512 characters.
fn shorten(error: &str) -> String {
    const SHOWN: usize = 512;
    match error.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &error[..cut]),
        None => error.to_string(),
    }
}

/// Why a rule has no value.
enum Stop {
    /// It erred (`no such key`, …).
    Error(String),
    /// Its cost passed its limit.
    Spent(String),
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

/// `text` compiled and checked for a `self` of `schema` (a resource's
/// root when `root`), as [`Budget::check`] compiles it: its tree, or
/// `None` when it is not run (reported where it runs).
pub(super) fn checked(text: &str, schema: &Value, root: bool) -> Option<IdedExpr> {
    let this = if root {
        typed::declared_resource(schema)
    } else {
        typed::declared(schema).unwrap_or(Ty::Dyn)
    };
    compile(text, &this, &Ty::Bool, false)
        .ok()
        .map(|compiled| compiled.expression.clone())
}

/// Most rules kept compiled (each at most [`MAX_RULE_BYTES`] of text and
/// its trees); past that a rule is compiled each time it runs.
const MAX_COMPILED: usize = 4096;

/// A rule ready to run: what it is made of, and its tree with its copies
/// charged ([`meter::instrument`]).
#[derive(Debug)]
struct Compiled {
    shape: Shape,
    expression: cel::IdedExpr,
    instrumented: cel::IdedExpr,
}

/// A rule compiled for a type of `self`: its text and the type's hash.
type CompiledKey = (String, u64);

/// Rules compiled once per process, by their text and the type of `self`:
/// `xfn test` validates every test's render against the same CRDs, and the
/// `cel` crate's parser costs more than most rules' evaluation.
static COMPILED: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<CompiledKey, std::sync::Arc<Compiled>>>,
> = std::sync::LazyLock::new(Default::default);

/// `text` compiled and checked for a `self` of type `this` (and an
/// `oldSelf` of the same type, or an optional one when `optional_old`) and
/// a value of type `want`, or why it is not run at all.
fn compile(
    text: &str,
    this: &Ty,
    want: &Ty,
    optional_old: bool,
) -> Result<std::sync::Arc<Compiled>, String> {
    use std::hash::{Hash, Hasher};
    within_bounds(text).map_err(|why| format!("the rule was not evaluated: {why}"))?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (this, want, optional_old).hash(&mut hasher);
    let key = (text.to_string(), hasher.finish());
    let compiled = || COMPILED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = compiled().get(&key) {
        return Ok(std::sync::Arc::clone(found));
    }
    let program = match catch_unwind(AssertUnwindSafe(|| Program::compile(text))) {
        Ok(Ok(program)) => program,
        Ok(Err(errors)) => return Err(format!("the rule does not compile: {errors}")),
        Err(_) => return Err("the rule does not compile: the CEL parser failed on it".into()),
    };
    let shape = Shape::of(program.expression());
    // `oldSelf` has `self`'s type; an optional one is left dynamic.
    let old = shape
        .variables
        .iter()
        .any(|v| v == "oldSelf")
        .then_some(if optional_old { &Ty::Dyn } else { this });
    let checked = check(program.expression(), this, old, want)
        .map_err(|error| format!("the rule does not compile: {error}"))?;
    let found = std::sync::Arc::new(Compiled {
        shape,
        instrumented: meter::instrument(&checked),
        expression: checked,
    });
    let mut cache = compiled();
    if cache.len() < MAX_COMPILED {
        cache.insert(key, std::sync::Arc::clone(&found));
    }
    Ok(found)
}

/// What a rule is made of: its variables.
#[derive(Debug, Default)]
struct Shape {
    variables: Vec<String>,
}

impl Shape {
    fn of(expression: &IdedExpr) -> Self {
        let mut shape = Shape::default();
        shape.visit(expression);
        shape
    }

    fn visit(&mut self, expression: &IdedExpr) {
        match &expression.expr {
            Expr::Call(call) => {
                if let Some(target) = &call.target {
                    self.visit(target);
                }
                for arg in &call.args {
                    self.visit(arg);
                }
            }
            Expr::Comprehension(c) => {
                for part in [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ] {
                    self.visit(part);
                }
            }
            Expr::Ident(name) => {
                if !self.variables.contains(name) {
                    self.variables.push(name.clone());
                }
            }
            Expr::List(list) => {
                for element in &list.elements {
                    self.visit(element);
                }
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(e) = &entry.expr {
                        self.visit(&e.key);
                        self.visit(&e.value);
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        self.visit(&f.value);
                    }
                }
            }
            Expr::Select(select) => self.visit(&select.operand),
            Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
}

/// The estimated `(cost, size)` of `expression` on a `self` of sizes `of`, as the API server's estimator
/// reckons: 1 per node, a comprehension's condition and step once per
/// element of its range (at most `self`'s values), a concatenation the sizes of its
/// operands (a 10th of them, strings costing 0.1 a byte), `self` and its
/// fields as large as `self`. A comprehension's variable counts 1: the
/// estimate is a first refusal, the runtime budget ([`meter`]) the bound.
fn estimate(expression: &IdedExpr, of: &Sizes) -> (u64, u64) {
    let all = |parts: &mut dyn Iterator<Item = &IdedExpr>| {
        parts.fold((1u64, 1u64), |(cost, sized), part| {
            let (c, s) = estimate(part, of);
            (cost.saturating_add(c), sized.saturating_add(s))
        })
    };
    match &expression.expr {
        Expr::Literal(cel::common::ast::LiteralValue::String(s)) => (1, 1 + s.len() as u64),
        Expr::Literal(_) | Expr::Unspecified => (1, 1),
        Expr::Ident(name) if name == "self" => (1, of.size),
        Expr::Ident(_) => (1, 1),
        Expr::Select(select) => {
            let (cost, sized) = estimate(&select.operand, of);
            (cost.saturating_add(1), sized)
        }
        Expr::List(list) => all(&mut list.elements.iter()),
        Expr::Map(map) => all(&mut map.entries.iter().flat_map(|entry| match &entry.expr {
            EntryExpr::MapEntry(e) => vec![&e.key, &e.value],
            EntryExpr::StructField(f) => vec![&f.value],
        })),
        Expr::Struct(s) => all(&mut s.entries.iter().flat_map(|entry| match &entry.expr {
            EntryExpr::MapEntry(e) => vec![&e.key, &e.value],
            EntryExpr::StructField(f) => vec![&f.value],
        })),
        Expr::Comprehension(c) => {
            // No more elements than `self` has values.
            let (range, items) = estimate(&c.iter_range, of);
            let items = items.min(of.values);
            let each = estimate(&c.loop_cond, of)
                .0
                .saturating_add(estimate(&c.loop_step, of).0);
            let cost = range
                .saturating_add(estimate(&c.accu_init, of).0)
                .saturating_add(items.saturating_mul(each))
                .saturating_add(estimate(&c.result, of).0);
            // `map()`, `filter()`: a list of elements; the others a bool.
            let built = meter::map_shape(c)
                .map(|(element, _)| items.saturating_mul(estimate(element, of).1));
            (cost, built.unwrap_or(1))
        }
        Expr::Call(call) => {
            let (cost, sized) = all(&mut call.target.as_deref().into_iter().chain(&call.args));
            match call.func_name.as_str() {
                // `sized` counts the call's node too.
                operators::ADD => (cost.saturating_add(sized / 10), sized - 1),
                operators::CONDITIONAL => (cost, sized - 1),
                _ => (cost, 1),
            }
        }
    }
}

/// The sizes of `self` for the cost estimate.
#[derive(Debug, Clone, Copy, Default)]
struct Sizes {
    /// JSON values plus the bytes of strings and keys.
    size: u64,
    /// JSON values.
    values: u64,
}

fn size_of(value: &Value) -> Sizes {
    let mut sizes = Sizes { size: 1, values: 1 };
    let mut add = |inner: Sizes| {
        sizes.size = sizes.size.saturating_add(inner.size);
        sizes.values = sizes.values.saturating_add(inner.values);
    };
    match value {
        Value::String(s) => add(Sizes {
            size: s.len() as u64,
            values: 0,
        }),
        Value::Array(items) => items.iter().for_each(|item| add(size_of(item))),
        Value::Object(map) => map.iter().for_each(|(k, v)| {
            add(Sizes {
                size: k.len() as u64,
                values: 0,
            });
            add(size_of(v));
        }),
        _ => {}
    }
    sizes
}
