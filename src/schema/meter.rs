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
//! (quadratic). `matches()` compiles its pattern once ([`super::pattern`]),
//! with Go's semantics.
use std::cell::Cell;
use std::sync::Arc;

use cel::common::ast::{
    operators, CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue,
};
use cel::extractors::This;
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
/// node), with the metering functions.
pub(super) fn context(this: Value) -> Context<'static> {
    let mut context = Context::default();
    context.add_function(COST, cost);
    context.add_function(MAP, map);
    context.add_function("matches", matches);
    context.add_variable_from_value("self", this);
    context
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

/// `matches()` with the pattern compiled once, in Go's semantics.
fn matches(
    ftx: &FunctionContext,
    This(this): This<Arc<String>>,
    pattern: Arc<String>,
) -> Result<bool, ExecutionError> {
    match super::pattern::compiled(&pattern) {
        Ok(re) => Ok(re.is_match(&this)),
        Err(error) => Err(ftx.error(format!("'{pattern}' not a valid regex:\n{error}"))),
    }
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
        Expr::Comprehension(c) => charged(match map_shape(c) {
            Some((element, guard)) => node(Expr::Call(CallExpr {
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
            None => node(Expr::Comprehension(Box::new(ComprehensionExpr {
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
            let called = node(Expr::Call(CallExpr {
                func_name: call.func_name.clone(),
                target: call.target.as_deref().map(|t| Box::new(argument(t))),
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
