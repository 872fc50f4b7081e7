//! The runtime cost budget of a CEL rule, as the API server's: evaluation
//! stops once the work done passes the budget, whatever the rule is.
//!
//! The `cel` crate (0.13) has no hook into its interpreter, and it copies
//! every value it reads from a field, passes to a function or builds, in
//! full. So a rule is rewritten before it runs ([`instrument`]): each node
//! whose value the interpreter copies or builds — a field select, an index,
//! a call, a list or map literal, a comprehension, a variable passed to a
//! function — is wrapped in `@xfn_cost(…)`, which charges the size of the
//! value ([`units`]: 1 per value, 1 per 10 bytes of a string, as the API
//! server's estimator) to a per-thread meter and fails the evaluation past
//! its limit. Every operation of the interpreter is linear in the sizes of
//! its operands, which are charged, and every loop step charges its
//! condition, so the work is bounded by the budget.
//!
//! `map()` and `filter()` run as `@xfn_map(…)`, linear in the list: the
//! crate's own expansion copies the accumulated list at every element
//! (quadratic). `matches()`, `find()` and `findAll()` compile their pattern
//! once ([`super::pattern`]), with Go's semantics (kube-cel's compile it at
//! every call, with Rust's). The equality and `+` of set and map lists
//! ([`super::check`]) charge every pair of items they compare.
use std::cell::Cell;
use std::sync::Arc;

use cel::common::ast::{
    operators, CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue,
};
use cel::extractors::{Arguments, This};
use cel::objects::Key;
use cel::{Context, ExecutionError, FunctionContext, Value};

/// What a rule spent, and its limit.
#[derive(Debug, Clone, Copy, Default)]
struct Meter {
    spent: u64,
    limit: u64,
}

thread_local! {
    static METER: Cell<Meter> = const { Cell::new(Meter { spent: 0, limit: 0 }) };
}

/// The wrapper that charges a node's value.
const COST: &str = "@xfn_cost";
/// `map()` and `filter()`, linear.
const MAP: &str = "@xfn_map";
/// `all()` and `exists()`, with cel-go's errors: an item's error is
/// absorbed when another item decides the result.
const QUANTIFIER: &str = "@xfn_quantifier";
/// `sum()` of a list whose item type is known (its zero).
pub(super) const SUM: &str = "@xfn_sum";
/// `string()` of a bool, duration or timestamp, as cel-go writes them.
pub(super) const STRING: &str = "@xfn_string";

/// The namespaces of Kubernetes' CEL library functions (`sets.contains`).
const NAMESPACES: &[&str] = &[
    "sets",
    "base64",
    "strings",
    "format",
    "lists",
    "jsonpatch",
    "ip",
    "math",
    "optional",
];

/// What one run of a rule gave.
#[derive(Debug)]
pub(super) struct Run {
    /// Its value, or why it has none.
    pub(super) value: Result<Value, String>,
    /// The cost it spent.
    pub(super) spent: u64,
    /// It was stopped at its limit (its value, if any, does not count:
    /// `stopped || true` is `true` in CEL).
    pub(super) stopped: bool,
}

/// A context whose `self` is `this` (converted once, for every rule of a
/// node): the `cel` crate's standard functions, Kubernetes' CEL libraries
/// (`kube-cel`, its URL and quantity libraries replaced by xfn's,
/// [`super::url`], [`super::quantity`]), what the API server has that they
/// lack (`type()`, type names, `size()` in code points, set and map lists),
/// and the metering functions. The functions and type names are
/// registered once per thread (a context of its own, kept for the
/// thread's life: a few hundred functions, once), `self` in a child scope.
pub(super) fn context(this: Value) -> Context<'static> {
    thread_local! {
        static BASE: &'static Context<'static> = Box::leak(Box::new(base()));
    }
    let mut context = BASE.with(|base| *base).new_inner_scope();
    context.add_variable_from_value("self", this);
    context
}

/// Every function and type name of [`context`].
fn base() -> Context<'static> {
    use kube_cel::KubeCelExt;
    let mut context = Context::default();
    context.register_all();
    context.add_function(COST, cost);
    context.add_function(MAP, map);
    context.add_function(QUANTIFIER, quantifier);
    context.add_function(SUM, sum);
    context.add_function(STRING, string);
    context.add_function("dyn", dynamic);
    super::timestamps::register(&mut context);
    super::url::register(&mut context);
    super::quantity::register(&mut context);
    context.add_function("matches", matches);
    context.add_function("find", find);
    context.add_function("findAll", find_all);
    context.add_function("size", size);
    context.add_function("type", type_of);
    context.add_function(super::check::SET_EQUALS, list_equals);
    context.add_function(super::check::SET_ADD, list_add);
    for name in super::check::TYPE_NAMES {
        context.add_variable_from_value(*name, type_value(name));
    }
    let protobuf: std::collections::HashMap<Key, Value> = ["Duration", "Timestamp"]
        .into_iter()
        .map(|t| (Key::from(t), type_value(&format!("google.protobuf.{t}"))))
        .collect();
    let google: std::collections::HashMap<Key, Value> =
        [(Key::from("protobuf"), Value::Map(protobuf.into()))].into();
    context.add_variable_from_value("google", Value::Map(google.into()));
    // kube-cel's IP and CIDR values name their types `net.IP`, `net.CIDR`.
    let net: std::collections::HashMap<Key, Value> = ["IP", "CIDR"]
        .into_iter()
        .map(|t| (Key::from(t), type_value(&format!("net.{t}"))))
        .collect();
    context.add_variable_from_value("net", Value::Map(net.into()));
    context
}

/// A CEL type as a value (`type(1) == int`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct TypeName(String);

impl cel::objects::Opaque for TypeName {
    fn runtime_type_name(&self) -> &str {
        "type"
    }
}

fn type_value(name: &str) -> Value {
    Value::Opaque(Arc::new(TypeName(name.to_string())))
}

/// `type(x)`: the name of `x`'s type, as cel-go names it.
fn type_of(This(value): This<Value>) -> Result<Value, ExecutionError> {
    let name = match &value {
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Function(..) => "function",
        Value::Int(_) => "int",
        Value::UInt(_) => "uint",
        Value::Float(_) => "double",
        Value::String(_) => "string",
        Value::Bytes(_) => "bytes",
        Value::Bool(_) => "bool",
        Value::Duration(_) => "google.protobuf.Duration",
        Value::Timestamp(_) => "google.protobuf.Timestamp",
        Value::Opaque(o) => o.runtime_type_name(),
        Value::Null => "null_type",
    };
    Ok(type_value(name))
}

/// `size()`: a string's length in code points, as cel-go counts it.
fn size(ftx: &FunctionContext, This(this): This<Value>) -> Result<i64, ExecutionError> {
    let size = match this {
        Value::String(s) => s.chars().count(),
        Value::List(l) => l.len(),
        Value::Map(m) => m.map.len(),
        Value::Bytes(b) => b.len(),
        other => return Err(ftx.error(format!("no such overload: size({other:?})"))),
    };
    Ok(i64::try_from(size).unwrap_or(i64::MAX))
}

/// `find()` with the pattern compiled once, in Go's semantics.
fn find(
    ftx: &FunctionContext,
    This(this): This<Arc<String>>,
    pattern: Arc<String>,
) -> Result<Value, ExecutionError> {
    let re = compiled(ftx, &pattern)?;
    let found = re.find(&this).map(|m| m.as_str()).unwrap_or_default();
    Ok(Value::String(Arc::new(found.to_string())))
}

/// `findAll()`, `findAll(limit)` (a negative limit is none).
fn find_all(
    ftx: &FunctionContext,
    This(this): This<Arc<String>>,
    Arguments(args): Arguments,
) -> Result<Value, ExecutionError> {
    let Some(Value::String(pattern)) = args.first() else {
        return Err(ftx.error("findAll expects a string pattern"));
    };
    let limit = match args.get(1) {
        Some(Value::Int(n)) => usize::try_from(*n).unwrap_or(usize::MAX),
        _ => usize::MAX,
    };
    let re = compiled(ftx, pattern)?;
    let found = re
        .find_iter(&this)
        .take(limit)
        .map(|m| Value::String(Arc::new(m.as_str().to_string())))
        .collect();
    Ok(Value::List(Arc::new(found)))
}

fn compiled(ftx: &FunctionContext, pattern: &str) -> Result<Arc<regex::Regex>, ExecutionError> {
    super::pattern::compiled(pattern)
        .map_err(|error| ftx.error(format!("'{pattern}' not a valid regex:\n{error}")))
}

/// Two lists' items and the keys of their items (none for a set).
type Lists = (Arc<Vec<Value>>, Arc<Vec<Value>>, Vec<Key>);

/// The items of two set or map lists and their keys (none for a set),
/// every pair of items charged.
fn lists(
    ftx: &FunctionContext,
    a: &Value,
    b: &Value,
    keys: &Value,
) -> Result<Lists, ExecutionError> {
    let (Value::List(a), Value::List(b), Value::List(keys)) = (a, b, keys) else {
        return Err(ExecutionError::NoSuchOverload);
    };
    let pairs = (a.len() as u64).saturating_mul(b.len() as u64);
    charge(pairs).map_err(|m| ftx.error(m))?;
    let keys = keys
        .iter()
        .filter_map(|k| match k {
            Value::String(s) => Some(Key::String(Arc::clone(s))),
            _ => None,
        })
        .collect();
    Ok((Arc::clone(a), Arc::clone(b), keys))
}

/// Whether `x` and `y` are the same item: equal (a set), or with equal
/// keys (a map list).
fn same_item(x: &Value, y: &Value, keys: &[Key]) -> bool {
    if keys.is_empty() {
        return x == y;
    }
    let field = |v: &Value, k: &Key| match v {
        Value::Map(m) => m.map.get(k).cloned(),
        _ => None,
    };
    keys.iter().all(|k| field(x, k) == field(y, k))
}

/// `==` of set and map lists: the same items, in any order.
fn list_equals(
    ftx: &FunctionContext,
    a: Value,
    b: Value,
    keys: Value,
) -> Result<bool, ExecutionError> {
    let (a, b, keys) = lists(ftx, &a, &b, &keys)?;
    Ok(a.len() == b.len()
        && a.iter().all(|x| {
            b.iter()
                .find(|y| same_item(x, y, &keys))
                .is_some_and(|y| x == y)
        }))
}

/// `+` of set and map lists: `a`'s items (replaced by `b`'s of the same
/// key), then `b`'s new ones.
fn list_add(
    ftx: &FunctionContext,
    a: Value,
    b: Value,
    keys: Value,
) -> Result<Value, ExecutionError> {
    let (a, b, keys) = lists(ftx, &a, &b, &keys)?;
    let mut out: Vec<Value> = a
        .iter()
        .map(|x| {
            b.iter()
                .find(|y| !keys.is_empty() && same_item(x, y, &keys))
                .unwrap_or(x)
                .clone()
        })
        .collect();
    for y in b.iter() {
        if !a.iter().any(|x| same_item(x, y, &keys)) {
            out.push(y.clone());
        }
    }
    Ok(Value::List(Arc::new(out)))
}

/// Runs an [`instrument`]ed rule in `context`, stopping past `limit`.
pub(super) fn run(instrumented: &IdedExpr, context: &Context, limit: u64) -> Run {
    METER.set(Meter { spent: 0, limit });
    let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Value::resolve(instrumented, context).map_err(|e| e.to_string())
    }))
    .unwrap_or_else(|_| Err("the CEL interpreter failed on it".into()));
    let meter = METER.get();
    Run {
        value,
        spent: meter.spent.min(meter.limit.saturating_add(1)),
        stopped: meter.spent > meter.limit,
    }
}

/// Charges `units`; an error once the meter passes its limit.
fn charge(units: u64) -> Result<(), String> {
    let mut meter = METER.get();
    meter.spent = meter.spent.saturating_add(units);
    METER.set(meter);
    if meter.spent > meter.limit {
        return Err(format!("the cost limit {} is spent", meter.limit));
    }
    Ok(())
}

/// The cost of holding `value`: 1, plus a 10th of a string's bytes, plus
/// its elements'.
fn units(value: &Value) -> u64 {
    match value {
        Value::String(s) => 1 + s.len() as u64 / 10,
        Value::Bytes(b) => 1 + b.len() as u64 / 10,
        Value::List(items) => 1 + items.iter().map(units).sum::<u64>(),
        Value::Map(map) => {
            1 + map
                .map
                .iter()
                .map(|(k, v)| key_units(k) + units(v))
                .sum::<u64>()
        }
        _ => 1,
    }
}

fn key_units(key: &Key) -> u64 {
    match key {
        Key::String(s) => 1 + s.len() as u64 / 10,
        _ => 1,
    }
}

fn cost(ftx: &FunctionContext, value: Value) -> Result<Value, ExecutionError> {
    charge(units(&value)).map_err(|m| ftx.error(m))?;
    Ok(value)
}

/// `@xfn_map(range, var, element, guard)`: `[element for var in range if
/// guard]`, one element pushed at a time.
fn map(ftx: &FunctionContext) -> Result<Value, ExecutionError> {
    let [range, var, element, guard] = ftx.args else {
        return Err(ftx.error("expects 4 arguments"));
    };
    let Expr::Ident(name) = &var.expr else {
        return Err(ftx.error("expects a variable"));
    };
    let items: Vec<Value> = match Value::resolve(range, ftx.ptx)? {
        Value::List(items) => items.iter().cloned().collect(),
        Value::Map(map) => map.map.keys().cloned().map(Value::from).collect(),
        _ => return Err(ExecutionError::NoSuchOverload),
    };
    let mut out = Vec::new();
    for item in items {
        charge(1).map_err(|m| ftx.error(m))?;
        let mut scope = ftx.ptx.new_inner_scope();
        scope.add_variable_from_value(name.as_str(), item);
        match Value::resolve(guard, &scope)? {
            Value::Bool(true) => {
                let value = Value::resolve(element, &scope)?;
                charge(units(&value)).map_err(|m| ftx.error(m))?;
                out.push(value);
            }
            Value::Bool(false) => {}
            _ => return Err(ExecutionError::NoSuchOverload),
        }
    }
    Ok(Value::List(Arc::new(out)))
}

/// `@xfn_quantifier(range, var, predicate, all)`: `all()` (`all` true) or
/// `exists()`. As cel-go: an item that decides the result wins over
/// another's error; otherwise the first error is the result.
fn quantifier(ftx: &FunctionContext) -> Result<Value, ExecutionError> {
    let [range, var, predicate, all] = ftx.args else {
        return Err(ftx.error("expects 4 arguments"));
    };
    let (Expr::Ident(name), Expr::Literal(LiteralValue::Boolean(all))) = (&var.expr, &all.expr)
    else {
        return Err(ftx.error("expects a variable and a bool"));
    };
    let all = *all.inner();
    let items: Vec<Value> = match Value::resolve(range, ftx.ptx)? {
        Value::List(items) => items.iter().cloned().collect(),
        Value::Map(map) => map.map.keys().cloned().map(Value::from).collect(),
        _ => return Err(ExecutionError::NoSuchOverload),
    };
    let mut error = None;
    for item in items {
        charge(1).map_err(|m| ftx.error(m))?;
        let mut scope = ftx.ptx.new_inner_scope();
        scope.add_variable_from_value(name.as_str(), item);
        match Value::resolve(predicate, &scope) {
            Ok(Value::Bool(b)) if b != all => return Ok(Value::Bool(b)),
            Ok(Value::Bool(_)) => {}
            Ok(_) => error = error.or(Some(ExecutionError::NoSuchOverload)),
            Err(e) => error = error.or(Some(e)),
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(Value::Bool(all)),
    }
}

/// `@xfn_sum(list, item type)`: the sum of a list of numbers or durations;
/// an empty list sums to its item type's zero.
fn sum(ftx: &FunctionContext, list: Value, item: Arc<String>) -> Result<Value, ExecutionError> {
    let Value::List(items) = list else {
        return Err(ExecutionError::NoSuchOverload);
    };
    let mut total = match item.as_str() {
        "double" => Value::Float(0.0),
        "uint" => Value::UInt(0),
        "google.protobuf.Duration" => Value::Duration(chrono::Duration::zero()),
        _ => Value::Int(0),
    };
    let overflow = || ftx.error("sum: overflow");
    for (i, value) in items.iter().enumerate() {
        total = match (&total, value) {
            (_, v) if i == 0 && item.as_str() == "dyn" => v.clone(),
            (Value::Int(a), Value::Int(b)) => Value::Int(a.checked_add(*b).ok_or_else(overflow)?),
            (Value::UInt(a), Value::UInt(b)) => {
                Value::UInt(a.checked_add(*b).ok_or_else(overflow)?)
            }
            (Value::Float(a), Value::Float(b)) => Value::Float(a + b),
            (Value::Float(a), Value::Int(b)) => Value::Float(a + *b as f64),
            (Value::Duration(a), Value::Duration(b)) => {
                Value::Duration(a.checked_add(b).ok_or_else(overflow)?)
            }
            _ => return Err(ftx.error(format!("sum: cannot add {value:?}"))),
        };
    }
    Ok(total)
}

/// `string()` of a bool, a duration (seconds, `3723.004s`) or a timestamp
/// (RFC 3339 with its offset and no trailing zeros), as cel-go writes them.
fn string(ftx: &FunctionContext, value: Value) -> Result<Value, ExecutionError> {
    let text = match value {
        Value::Bool(b) => b.to_string(),
        Value::Duration(d) => {
            let nanos = d
                .num_nanoseconds()
                .ok_or_else(|| ftx.error("duration overflow"))?;
            format!("{}s", nanos as f64 / 1e9)
        }
        Value::Timestamp(t) => {
            use chrono::Timelike;
            let mut text = t.format("%Y-%m-%dT%H:%M:%S").to_string();
            if t.nanosecond() > 0 {
                let fraction = format!("{:09}", t.nanosecond());
                text.push('.');
                text.push_str(fraction.trim_end_matches('0'));
            }
            if t.offset().local_minus_utc() == 0 {
                text.push('Z');
            } else {
                text.push_str(&t.format("%:z").to_string());
            }
            text
        }
        Value::String(s) => return Ok(Value::String(s)),
        other => return Err(ftx.error(format!("string: cannot convert {other:?}"))),
    };
    Ok(Value::String(Arc::new(text)))
}

/// `dyn(x)`: `x`, its type left to run time.
fn dynamic(This(value): This<Value>) -> Result<Value, ExecutionError> {
    Ok(value)
}

/// `matches()` with the pattern compiled once, in Go's semantics.
fn matches(
    ftx: &FunctionContext,
    This(this): This<Arc<String>>,
    pattern: Arc<String>,
) -> Result<bool, ExecutionError> {
    Ok(compiled(ftx, &pattern)?.is_match(&this))
}

/// `expression` with its copies charged (the module's header says which).
pub(super) fn instrument(expression: &IdedExpr) -> IdedExpr {
    let id = expression.id;
    let node = |expr| IdedExpr { id, expr };
    match &expression.expr {
        Expr::Literal(_) | Expr::Ident(_) | Expr::Unspecified | Expr::Struct(_) => {
            expression.clone()
        }
        Expr::Select(select) => {
            let mut select = select.clone();
            select.operand = Box::new(instrument(&select.operand));
            let test = select.test;
            let selected = node(Expr::Select(select));
            if test {
                selected
            } else {
                charged(selected)
            }
        }
        Expr::List(list) => charged(node(Expr::List(ListExpr {
            elements: list.elements.iter().map(argument).collect(),
            optional_indices: list.optional_indices.clone(),
        }))),
        Expr::Map(map) => {
            let mut map = map.clone();
            for entry in &mut map.entries {
                if let EntryExpr::MapEntry(e) = &mut entry.expr {
                    e.key = argument(&e.key);
                    e.value = argument(&e.value);
                }
            }
            charged(node(Expr::Map(map)))
        }
        Expr::Comprehension(c) => charged(match (map_shape(c), quantifier_shape(c)) {
            (None, Some((predicate, all))) => node(Expr::Call(CallExpr {
                func_name: QUANTIFIER.into(),
                target: None,
                args: vec![
                    argument(&c.iter_range),
                    node(Expr::Ident(c.iter_var.clone())),
                    instrument(predicate),
                    node(Expr::Literal(LiteralValue::Boolean(all.into()))),
                ],
            })),
            (Some((element, guard)), _) => node(Expr::Call(CallExpr {
                func_name: MAP.into(),
                target: None,
                args: vec![
                    argument(&c.iter_range),
                    node(Expr::Ident(c.iter_var.clone())),
                    instrument(element),
                    guard
                        .map(instrument)
                        .unwrap_or_else(|| node(Expr::Literal(LiteralValue::Boolean(true.into())))),
                ],
            })),
            (None, None) => node(Expr::Comprehension(Box::new(ComprehensionExpr {
                iter_range: argument(&c.iter_range),
                iter_var: c.iter_var.clone(),
                iter_var2: c.iter_var2.clone(),
                accu_var: c.accu_var.clone(),
                accu_init: instrument(&c.accu_init),
                loop_cond: charged(instrument(&c.loop_cond)),
                loop_step: instrument(&c.loop_step),
                result: instrument(&c.result),
            }))),
        }),
        Expr::Call(call) => {
            let lazy = matches!(
                call.func_name.as_str(),
                operators::LOGICAL_AND
                    | operators::LOGICAL_OR
                    | operators::LOGICAL_NOT
                    | operators::CONDITIONAL
                    | operators::NOT_STRICTLY_FALSE
            );
            let indexed = matches!(
                call.func_name.as_str(),
                operators::INDEX | operators::OPT_INDEX | operators::OPT_SELECT
            );
            let args = call
                .args
                .iter()
                .enumerate()
                .map(|(i, arg)| {
                    // The interpreter reads these in place.
                    if lazy || (indexed && i == 0) {
                        instrument(arg)
                    } else {
                        argument(arg)
                    }
                })
                .collect();
            // `sets.contains(…)`: the interpreter finds the function by the
            // qualified name only while its namespace stays a bare name.
            let target = call.target.as_deref().map(|t| match &t.expr {
                Expr::Ident(name) if NAMESPACES.contains(&name.as_str()) => t.clone(),
                _ => argument(t),
            });
            let called = node(Expr::Call(CallExpr {
                func_name: call.func_name.clone(),
                target: target.map(Box::new),
                args,
            }));
            if lazy {
                called
            } else {
                charged(called)
            }
        }
    }
}

/// An operand the interpreter copies: a variable is charged too.
fn argument(expression: &IdedExpr) -> IdedExpr {
    match expression.expr {
        Expr::Ident(_) => charged(expression.clone()),
        _ => instrument(expression),
    }
}

fn charged(expression: IdedExpr) -> IdedExpr {
    IdedExpr {
        id: expression.id,
        expr: Expr::Call(CallExpr {
            func_name: COST.into(),
            target: None,
            args: vec![expression],
        }),
    }
}

/// `(predicate, all)` of the crate's expansion of `all(x, predicate)`
/// (`true`, `@result && predicate`) and `exists(x, predicate)` (`false`,
/// `@result || predicate`).
fn quantifier_shape(c: &ComprehensionExpr) -> Option<(&IdedExpr, bool)> {
    let is_accu = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(n) if *n == c.accu_var);
    let Expr::Literal(LiteralValue::Boolean(init)) = &c.accu_init.expr else {
        return None;
    };
    let all = *init.inner();
    let Expr::Call(step) = &c.loop_step.expr else {
        return None;
    };
    let joins = if all {
        operators::LOGICAL_AND
    } else {
        operators::LOGICAL_OR
    };
    match step.args.as_slice() {
        [accu, predicate]
            if step.func_name == joins
                && is_accu(accu)
                && is_accu(&c.result)
                && c.iter_var2.is_none() =>
        {
            Some((predicate, all))
        }
        _ => None,
    }
}

/// `(element, guard)` of the crate's expansion of `map(x, [guard,]
/// element)` and `filter(x, guard)`: an empty list, a `true` condition,
/// `@result + [element]` (under `guard ? … : @result`), `@result`.
pub(super) fn map_shape(c: &ComprehensionExpr) -> Option<(&IdedExpr, Option<&IdedExpr>)> {
    let is_accu = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(n) if *n == c.accu_var);
    fn appended<'e>(e: &'e IdedExpr, is_accu: &dyn Fn(&IdedExpr) -> bool) -> Option<&'e IdedExpr> {
        let Expr::Call(call) = &e.expr else {
            return None;
        };
        match call.args.as_slice() {
            [accu, list] if call.func_name == operators::ADD && is_accu(accu) => match &list.expr {
                Expr::List(list)
                    if list.elements.len() == 1 && list.optional_indices.is_empty() =>
                {
                    list.elements.first()
                }
                _ => None,
            },
            _ => None,
        }
    }
    let empty = matches!(&c.accu_init.expr, Expr::List(l) if l.elements.is_empty());
    let always = matches!(&c.loop_cond.expr, Expr::Literal(LiteralValue::Boolean(b)) if *b.inner());
    if !empty || !always || !is_accu(&c.result) || c.iter_var2.is_some() {
        return None;
    }
    if let Some(element) = appended(&c.loop_step, &is_accu) {
        return Some((element, None));
    }
    let Expr::Call(call) = &c.loop_step.expr else {
        return None;
    };
    match call.args.as_slice() {
        [guard, step, otherwise]
            if call.func_name == operators::CONDITIONAL && is_accu(otherwise) =>
        {
            appended(step, &is_accu).map(|element| (element, Some(guard)))
        }
        _ => None,
    }
}
