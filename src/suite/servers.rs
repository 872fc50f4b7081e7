//! Function servers shared by every test of a run: one caller per distinct
//! Function (same name, package, runtime and settings), made and started by
//! the first test that needs it, reused by every later one, stopped once at
//! the end. A Function whose server does not start fails each test that
//! uses it, with why.
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::OnceCell;

use crate::compose::{
    caller_for, CallerMap, ContainerDefaults, ContainerSteps, Function, FunctionCaller,
};
use crate::runner::Runner;

type Started = Result<Arc<dyn FunctionCaller>, String>;

/// The run's function servers.
pub(crate) struct SharedServers {
    runner: Option<Arc<Runner>>,
    defaults: ContainerDefaults,
    started: RefCell<HashMap<String, Rc<OnceCell<Started>>>>,
}

impl SharedServers {
    pub(crate) fn new(runner: Option<Arc<Runner>>, defaults: ContainerDefaults) -> Self {
        Self {
            runner,
            defaults,
            started: RefCell::new(HashMap::new()),
        }
    }

    /// Where an alpha Composition's steps run: the run's runner (or a
    /// daemon at a step's endpoint), as `xfn render` runs them.
    pub(crate) fn alpha_steps(&self) -> ContainerSteps {
        ContainerSteps {
            runner: self.runner.clone(),
            defaults: self.defaults.clone(),
        }
    }

    /// How many distinct Functions were started.
    pub(crate) fn len(&self) -> usize {
        self.started.borrow().len()
    }

    /// A started caller for each of `functions`, by name.
    pub(crate) async fn callers(&self, functions: &[Function]) -> Result<CallerMap, String> {
        let mut map = CallerMap::new();
        for function in functions {
            // Function's Debug is every setting that makes its server.
            let key = format!("{function:?}");
            let cell = Rc::clone(self.started.borrow_mut().entry(key).or_default());
            let started = cell
                .get_or_init(|| async {
                    let caller = caller_for(function, self.runner.as_ref(), &self.defaults)
                        .map_err(|e| crate::chain::Chain(&e).to_string())?;
                    caller
                        .start()
                        .await
                        .map_err(|e| crate::chain::Chain(&e).to_string())?;
                    Ok(caller)
                })
                .await;
            match started {
                Ok(caller) => {
                    map.insert(function.name.clone(), Arc::clone(caller));
                }
                Err(message) => return Err(format!("Function {:?}: {message}", function.name)),
            }
        }
        Ok(map)
    }

    /// Stops every server started.
    pub(crate) async fn stop(&self) {
        let cells: Vec<Rc<OnceCell<Started>>> = self.started.borrow().values().cloned().collect();
        let callers: Vec<Arc<dyn FunctionCaller>> = cells
            .iter()
            .filter_map(|c| c.get().and_then(|s| s.as_ref().ok()).cloned())
            .collect();
        futures::future::join_all(callers.iter().map(|c| c.stop())).await;
    }
}
