//! The API server's compile-time refusals, from a rule's tree and the
//! declared type of `self` ([`super::typed::declared`]): a rule cel-go's
//! checker would not admit in a CRD is an error, not a pass. The `cel` crate
//! has no checker; this one knows what the declared types say and gives up
//! (`dyn`) where it does not, so it refuses only what cel-go refuses:
//! selecting a field the schema does not declare (`undefined field`),
//! indexing an object, comparing values of different types (`string` with
//! `null`, an object with a map literal), `sum()` of non-numbers,
//! `min()`/`max()` of lists or maps, `string()` of a type, a constant regular
//! expression that does not compile, a rule whose value is not a bool.
//!
//! It also rewrites what the types change at run time: `==`, `!=` and `+`
//! of `x-kubernetes-list-type: set|map` lists compare as sets or by key and
//! merge ([`SET_EQUALS`], [`SET_ADD`], run by [`super::meter`]).
use std::collections::HashMap;

use cel::common::ast::{
    operators, CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue,
};

use super::typed::{ListKind, Ty};

/// `@xfn_list_equals(a, b, keys)`: a set (no keys) or map list (its keys)
/// equality.
pub(super) const SET_EQUALS: &str = "@xfn_list_equals";
/// `@xfn_list_add(a, b, keys)`: a set union or map list merge.
pub(super) const SET_ADD: &str = "@xfn_list_add";

/// The type names a rule may use as values (`type(x) == int`).
pub(super) const TYPE_NAMES: &[&str] = &[
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
];

/// `rule` checked against `this` (the declared type of `self`), `old`
/// (of `oldSelf`, in a transition rule) and the
/// type its value must have (`bool` for a rule, `string` for a
/// `messageExpression`): its tree, rewritten for list types, or cel-go's
/// refusal.
pub(super) fn check(
    rule: &IdedExpr,
    this: &Ty,
    old: Option<&Ty>,
    want: &Ty,
) -> Result<IdedExpr, String> {
    let mut scope = HashMap::new();
    scope.insert("self".to_string(), this.clone());
    if let Some(old) = old {
        scope.insert("oldSelf".to_string(), old.clone());
    }
    let (ty, tree) = Checker { scope }.expr(rule)?;
    if ty == *want || ty == Ty::Dyn {
        return Ok(tree);
    }
    Err(format!(
        "cel expression must evaluate to a {}, not {}",
        want.name(),
        ty.name()
    ))
}

struct Checker {
    scope: HashMap<String, Ty>,
}

fn no_overload(function: &str, args: &[&Ty]) -> String {
    let names: Vec<String> = args.iter().map(|t| t.name()).collect();
    format!(
        "found no matching overload for '{function}' applied to '({})'",
        names.join(", ")
    )
}

/// Whether values of `a` and `b` may be compared (cel-go unifies them).
fn comparable(a: &Ty, b: &Ty) -> bool {
    match (a, b) {
        (Ty::Dyn, _) | (_, Ty::Dyn) => true,
        (Ty::List(x, _), Ty::List(y, _)) => comparable(x, y),
        (Ty::Map(k1, v1), Ty::Map(k2, v2)) => comparable(k1, k2) && comparable(v1, v2),
        (Ty::Object(_), Ty::Object(_)) => true,
        // cel-go's legacy nullability (checker/types.go `isLegacyNullable`):
        // an object (a struct), a timestamp or a duration may be null.
        (Ty::Null, Ty::Object(_) | Ty::Timestamp | Ty::Duration)
        | (Ty::Object(_) | Ty::Timestamp | Ty::Duration, Ty::Null) => true,
        _ => std::mem::discriminant(a) == std::mem::discriminant(b),
    }
}

/// `a` and `b` joined: their type when they agree, else `dyn`.
fn join(a: &Ty, b: &Ty) -> Ty {
    match (a, b) {
        (Ty::List(x, k), Ty::List(y, _)) => Ty::List(Box::new(join(x, y)), k.clone()),
        _ if a == b => a.clone(),
        _ => Ty::Dyn,
    }
}

fn node(id: u64, expr: Expr) -> IdedExpr {
    IdedExpr { id, expr }
}

fn call(id: u64, name: &str, target: Option<IdedExpr>, args: Vec<IdedExpr>) -> IdedExpr {
    node(
        id,
        Expr::Call(CallExpr {
            func_name: name.into(),
            target: target.map(Box::new),
            args,
        }),
    )
}

/// The keys of a set (none) or map list, as a list literal.
fn keys_literal(id: u64, keys: &[String]) -> IdedExpr {
    node(
        id,
        Expr::List(ListExpr {
            elements: keys
                .iter()
                .map(|k| node(id, Expr::Literal(LiteralValue::String(k.clone().into()))))
                .collect(),
            optional_indices: Vec::new(),
        }),
    )
}

fn list_keys(ty: &Ty) -> Option<Vec<String>> {
    match ty {
        Ty::List(_, ListKind::Set) => Some(Vec::new()),
        Ty::List(_, ListKind::Map(keys)) => Some(keys.clone()),
        _ => None,
    }
}

/// The dotted name `e` spells, if it is one (`google.protobuf.Duration`).
fn qualified(e: &IdedExpr) -> Option<String> {
    match &e.expr {
        Expr::Ident(name) => Some(name.clone()),
        Expr::Select(s) if !s.test => Some(format!("{}.{}", qualified(&s.operand)?, s.field)),
        _ => None,
    }
}

impl Checker {
    fn expr(&mut self, e: &IdedExpr) -> Result<(Ty, IdedExpr), String> {
        let id = e.id;
        match &e.expr {
            Expr::Literal(literal) => Ok((
                match literal {
                    LiteralValue::Boolean(_) => Ty::Bool,
                    LiteralValue::Bytes(_) => Ty::Bytes,
                    LiteralValue::Double(_) => Ty::Double,
                    LiteralValue::Int(_) => Ty::Int,
                    LiteralValue::Null => Ty::Null,
                    LiteralValue::String(_) => Ty::String,
                    LiteralValue::UInt(_) => Ty::Uint,
                },
                e.clone(),
            )),
            Expr::Ident(name) => {
                let ty = match self.scope.get(name) {
                    Some(ty) => ty.clone(),
                    None if TYPE_NAMES.contains(&name.as_str()) => Ty::Type,
                    None => Ty::Dyn,
                };
                Ok((ty, e.clone()))
            }
            Expr::Select(select) => {
                if matches!(
                    qualified(e).as_deref(),
                    Some("google.protobuf.Duration" | "google.protobuf.Timestamp")
                ) {
                    return Ok((Ty::Type, e.clone()));
                }
                let (operand, tree) = self.expr(&select.operand)?;
                let field = &select.field;
                if super::typed::RESERVED.contains(&field.as_str()) {
                    return Err(format!(
                        "Syntax error: mismatched input '{field}' expecting IDENTIFIER"
                    ));
                }
                let ty = match &operand {
                    Ty::Object(fields) => fields
                        .get(field)
                        .cloned()
                        .ok_or_else(|| format!("undefined field '{field}'"))?,
                    Ty::Map(_, value) => (**value).clone(),
                    Ty::Dyn => Ty::Dyn,
                    other => {
                        return Err(format!(
                            "type '{}' does not support field selection",
                            other.name()
                        ))
                    }
                };
                let mut select = select.clone();
                select.operand = Box::new(tree);
                let ty = if select.test { Ty::Bool } else { ty };
                Ok((ty, node(id, Expr::Select(select))))
            }
            Expr::List(list) => {
                let mut item = None::<Ty>;
                let mut elements = Vec::new();
                for element in &list.elements {
                    let (ty, tree) = self.expr(element)?;
                    item = Some(match item {
                        None => ty,
                        Some(seen) => join(&seen, &ty),
                    });
                    elements.push(tree);
                }
                let ty = Ty::List(Box::new(item.unwrap_or(Ty::Dyn)), ListKind::Atomic);
                let list = ListExpr {
                    elements,
                    optional_indices: list.optional_indices.clone(),
                };
                Ok((ty, node(id, Expr::List(list))))
            }
            Expr::Map(map) => {
                let mut map = map.clone();
                let (mut key_ty, mut value_ty) = (None::<Ty>, None::<Ty>);
                for entry in &mut map.entries {
                    if let EntryExpr::MapEntry(entry) = &mut entry.expr {
                        let (k, key) = self.expr(&entry.key)?;
                        let (v, value) = self.expr(&entry.value)?;
                        key_ty = Some(key_ty.map_or(k.clone(), |seen| join(&seen, &k)));
                        value_ty = Some(value_ty.map_or(v.clone(), |seen| join(&seen, &v)));
                        entry.key = key;
                        entry.value = value;
                    }
                }
                let ty = Ty::Map(
                    Box::new(key_ty.unwrap_or(Ty::Dyn)),
                    Box::new(value_ty.unwrap_or(Ty::Dyn)),
                );
                Ok((ty, node(id, Expr::Map(map))))
            }
            Expr::Comprehension(c) => self.comprehension(id, c),
            Expr::Call(c) => self.call(id, c),
            Expr::Struct(_) | Expr::Unspecified => Ok((Ty::Dyn, e.clone())),
        }
    }

    fn comprehension(&mut self, id: u64, c: &ComprehensionExpr) -> Result<(Ty, IdedExpr), String> {
        let (range, iter_range) = self.expr(&c.iter_range)?;
        let (first, second) = match (&range, &c.iter_var2) {
            (Ty::List(item, _), None) => ((**item).clone(), Ty::Dyn),
            (Ty::List(item, _), Some(_)) => (Ty::Int, (**item).clone()),
            (Ty::Map(key, value), _) => ((**key).clone(), (**value).clone()),
            _ => (Ty::Dyn, Ty::Dyn),
        };
        let (accu, accu_init) = self.expr(&c.accu_init)?;
        let saved = self.scope.clone();
        self.scope.insert(c.iter_var.clone(), first);
        if let Some(var2) = &c.iter_var2 {
            self.scope.insert(var2.clone(), second);
        }
        // The accumulator's type may change as the loop runs (`[] + [x]`).
        let accu = match accu {
            Ty::List(_, kind) => Ty::List(Box::new(Ty::Dyn), kind),
            other => other,
        };
        self.scope.insert(c.accu_var.clone(), accu);
        let checked = (|| {
            let loop_cond = self.expr(&c.loop_cond)?.1;
            let loop_step = self.expr(&c.loop_step)?.1;
            let (ty, result) = self.expr(&c.result)?;
            Ok::<_, String>((ty, loop_cond, loop_step, result))
        })();
        self.scope = saved;
        let (ty, loop_cond, loop_step, result) = checked?;
        let comprehension = ComprehensionExpr {
            iter_range,
            iter_var: c.iter_var.clone(),
            iter_var2: c.iter_var2.clone(),
            accu_var: c.accu_var.clone(),
            accu_init,
            loop_cond,
            loop_step,
            result,
        };
        Ok((ty, node(id, Expr::Comprehension(Box::new(comprehension)))))
    }

    fn call(&mut self, id: u64, c: &CallExpr) -> Result<(Ty, IdedExpr), String> {
        let name = c.func_name.as_str();
        let target = match &c.target {
            Some(t) => Some(self.expr(t)?),
            None => None,
        };
        let mut args = Vec::new();
        for arg in &c.args {
            args.push(self.expr(arg)?);
        }
        let arg_types: Vec<&Ty> = target.iter().chain(&args).map(|(t, _)| t).collect();
        let ty = self.call_type(name, &arg_types, c)?;
        let target_tree = target.as_ref().map(|(_, t)| t.clone());
        let arg_trees: Vec<IdedExpr> = args.iter().map(|(_, t)| t.clone()).collect();
        // `==`, `!=` and `+` of set and map lists.
        if let ([(a, _), (b, _)], None) = (args.as_slice(), &target) {
            let keys = list_keys(a).or_else(|| list_keys(b));
            if let Some(keys) = keys {
                let with_keys = |function: &str| {
                    let mut args = arg_trees.clone();
                    args.push(keys_literal(id, &keys));
                    call(id, function, None, args)
                };
                match name {
                    operators::EQUALS => return Ok((ty, with_keys(SET_EQUALS))),
                    operators::NOT_EQUALS => {
                        let equals = with_keys(SET_EQUALS);
                        return Ok((ty, call(id, operators::LOGICAL_NOT, None, vec![equals])));
                    }
                    operators::ADD => {
                        let kind = match a {
                            Ty::List(_, kind) => kind.clone(),
                            _ => ListKind::Atomic,
                        };
                        if kind != ListKind::Atomic {
                            return Ok((ty, with_keys(SET_ADD)));
                        }
                    }
                    _ => {}
                }
            }
        }
        // `sum()` of a known item type (an empty list sums to its zero);
        // `string()` of a bool, duration or timestamp.
        match (name, &target, args.as_slice()) {
            ("sum", Some((Ty::List(item, _), tree)), []) => {
                let item = node(id, Expr::Literal(LiteralValue::String(item.name().into())));
                return Ok((
                    ty,
                    call(id, super::meter::SUM, None, vec![tree.clone(), item]),
                ));
            }
            ("string", None, [(Ty::Bool | Ty::Duration | Ty::Timestamp, tree)]) => {
                return Ok((ty, call(id, super::meter::STRING, None, vec![tree.clone()])));
            }
            _ => {}
        }
        Ok((ty, call(id, name, target_tree, arg_trees)))
    }

    /// The type of a call, or cel-go's refusal.
    fn call_type(&self, name: &str, args: &[&Ty], c: &CallExpr) -> Result<Ty, String> {
        let numeric = |t: &Ty| matches!(t, Ty::Int | Ty::Uint | Ty::Double | Ty::Dyn);
        Ok(match (name, args) {
            (operators::EQUALS | operators::NOT_EQUALS, [a, b]) => {
                if !comparable(a, b) {
                    return Err(no_overload(name, args));
                }
                Ty::Bool
            }
            (
                operators::LESS
                | operators::LESS_EQUALS
                | operators::GREATER
                | operators::GREATER_EQUALS,
                [a, b],
            ) => {
                // Kubernetes compares int, uint and double with each other.
                if !(comparable(a, b) || (numeric(a) && numeric(b))) {
                    return Err(no_overload(name, args));
                }
                Ty::Bool
            }
            (operators::ADD, [a, b]) => match (a, b) {
                (Ty::Timestamp, Ty::Duration) | (Ty::Duration, Ty::Timestamp) => Ty::Timestamp,
                (Ty::List(x, kind), Ty::List(y, _)) => Ty::List(Box::new(join(x, y)), kind.clone()),
                _ => join(a, b),
            },
            (operators::SUBSTRACT, [Ty::Timestamp, Ty::Timestamp]) => Ty::Duration,
            (operators::SUBSTRACT, [Ty::Timestamp, Ty::Duration]) => Ty::Timestamp,
            (
                operators::SUBSTRACT | operators::MULTIPLY | operators::DIVIDE | operators::MODULO,
                [a, b],
            ) => join(a, b),
            (operators::NEGATE, [a]) => (*a).clone(),
            (
                operators::LOGICAL_AND
                | operators::LOGICAL_OR
                | operators::LOGICAL_NOT
                | operators::NOT_STRICTLY_FALSE
                | operators::IN
                | "has"
                | "startsWith"
                | "endsWith"
                | "contains"
                | "matches"
                | "isSorted"
                | "all"
                | "exists"
                | "exists_one",
                _,
            ) => {
                self.constant_pattern(name, c)?;
                Ty::Bool
            }
            (operators::CONDITIONAL, [_, a, b]) => join(a, b),
            (operators::INDEX, [container, _]) => match container {
                Ty::List(item, _) => (**item).clone(),
                Ty::Map(_, value) => (**value).clone(),
                Ty::Object(_) => return Err(no_overload(name, args)),
                _ => Ty::Dyn,
            },
            ("size", _) => Ty::Int,
            ("int", _) => Ty::Int,
            ("uint", _) => Ty::Uint,
            ("double", _) => Ty::Double,
            ("bool", _) => Ty::Bool,
            ("string", [Ty::Type]) => return Err(no_overload(name, args)),
            ("string", _) => Ty::String,
            ("bytes", _) => Ty::Bytes,
            ("duration", _) => Ty::Duration,
            ("timestamp", _) => Ty::Timestamp,
            ("type", _) => Ty::Type,
            ("find", _) => {
                self.constant_pattern(name, c)?;
                Ty::String
            }
            ("findAll", _) => {
                self.constant_pattern(name, c)?;
                Ty::List(Box::new(Ty::String), ListKind::Atomic)
            }
            ("sum", [Ty::List(item, _)]) => match **item {
                Ty::Int | Ty::Uint | Ty::Double | Ty::Duration | Ty::Dyn => (**item).clone(),
                _ => return Err(no_overload(name, args)),
            },
            ("min" | "max", [Ty::List(item, _)]) => match **item {
                Ty::List(..) | Ty::Map(..) | Ty::Object(_) => return Err(no_overload(name, args)),
                _ => (**item).clone(),
            },
            (
                "getFullYear" | "getMonth" | "getDayOfYear" | "getDayOfMonth" | "getDate"
                | "getDayOfWeek" | "getHours" | "getMinutes" | "getSeconds" | "getMilliseconds"
                | "indexOf" | "lastIndexOf",
                _,
            ) => Ty::Int,
            (
                "lowerAscii" | "upperAscii" | "replace" | "substring" | "trim" | "charAt" | "join",
                _,
            ) => Ty::String,
            ("split", _) => Ty::List(Box::new(Ty::String), ListKind::Atomic),
            _ => Ty::Dyn,
        })
    }

    /// A constant pattern of `matches()`, `find()`, `findAll()` compiles,
    /// as cel-go checks it when it builds the program.
    fn constant_pattern(&self, name: &str, c: &CallExpr) -> Result<(), String> {
        if !matches!(name, "matches" | "find" | "findAll") {
            return Ok(());
        }
        let at = usize::from(c.target.is_none());
        let pattern = c.args.get(at).and_then(|a| match &a.expr {
            Expr::Literal(LiteralValue::String(s)) => Some(s.inner().to_string()),
            _ => None,
        });
        match pattern {
            Some(p) => super::pattern::compiled(&p).map(|_| ()).map_err(|e| {
                let e = e.split_whitespace().collect::<Vec<_>>().join(" ");
                format!("error parsing regexp: {e}")
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `rule` checked against the type of `schema`.
    fn checked(rule: &str, schema: serde_json::Value) -> Result<IdedExpr, String> {
        let program = cel::Program::compile(rule).map_err(|e| e.to_string())?;
        let this = super::super::typed::declared(&schema).unwrap_or(Ty::Dyn);
        check(program.expression(), &this, None, &Ty::Bool)
    }

    fn refused(rule: &str, schema: serde_json::Value) -> String {
        checked(rule, schema).expect_err(rule)
    }

    fn strings() -> serde_json::Value {
        json!({"type": "object", "properties": {
            "s": {"type": "string", "nullable": true},
            "objs": {"type": "array", "items": {"type": "object", "properties": {"f1": {"type": "string"}}}},
            "set": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}}})
    }

    #[test]
    fn comparing_a_typed_value_with_null_is_refused() {
        let refusal = refused("self.s != null", strings());
        assert!(
            refusal.contains("no matching overload for '_!=_' applied to '(string, null)'"),
            "{refusal}"
        );
    }

    #[test]
    fn comparing_an_object_with_a_map_literal_is_refused() {
        let refusal = refused("self.objs[0] == {'f1': 'a'}", strings());
        assert!(refusal.contains("'_==_'"), "{refusal}");
    }

    #[test]
    fn an_undeclared_field_is_refused_even_under_has() {
        assert_eq!(refused("has(self.z)", strings()), "undefined field 'z'");
        assert!(refused("self['s'] == 'a'", strings()).contains("'_[_]'"));
    }

    #[test]
    fn a_rule_whose_value_is_not_a_bool_is_refused() {
        assert!(refused("self.s", strings()).contains("must evaluate to a bool"));
    }

    #[test]
    fn a_constant_pattern_that_does_not_compile_is_refused() {
        for rule in [
            "self.s.matches(')')",
            "self.s.find(')') == ''",
            "self.s.findAll(')', 1) == []",
        ] {
            assert!(
                refused(rule, strings()).contains("error parsing regexp"),
                "{rule}"
            );
        }
    }

    #[test]
    fn library_calls_on_the_wrong_list_types_are_refused() {
        assert!(refused("['a', 'b'].sum() == 'c'", strings()).contains("'sum'"));
        assert!(refused("[[1], [2]].min() == [1]", strings()).contains("'min'"));
        assert!(refused("string(type(self)) == ''", strings()).contains("'string'"));
    }

    #[test]
    fn set_equality_and_union_are_rewritten_and_dynamic_values_pass() {
        let tree = checked("self.set == ['a'] && self.set + ['b'] != []", strings()).unwrap();
        let text = format!("{tree:?}");
        assert!(
            text.contains(SET_EQUALS) && text.contains(SET_ADD),
            "{text}"
        );
        for rule in [
            "self.s == 'a' || type(self.s) == string",
            "self.objs.all(o, o.f1.startsWith('a'))",
            "dyn(self.s) == 1",
        ] {
            checked(rule, strings()).unwrap();
        }
    }
}
