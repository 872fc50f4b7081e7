//! Function servers shared by every test of a run: one runtime per distinct
//! Function (same name, package, runtime and settings), made and started by
//! the first test that needs it, reused by every later one, stopped once at
//! the end. A Function whose server does not start fails each test that
//! uses it, with why.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;

use crate::compose::{
    runtime_for, ContainerDefaults, ContainerSteps, Function, Runtime, RuntimeMap,
};
use crate::runner::Runner;

type Started = Result<Arc<dyn Runtime>, String>;

/// The run's function servers.
pub(crate) struct SharedServers {
    runner: Option<Arc<Runner>>,
    defaults: ContainerDefaults,
    started: Mutex<HashMap<String, Arc<OnceCell<Started>>>>,
}

impl SharedServers {
    pub(crate) fn new(runner: Option<Arc<Runner>>, defaults: ContainerDefaults) -> Self {
        Self {
            runner,
            defaults,
            started: Mutex::default(),
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

    fn started(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<OnceCell<Started>>>> {
        self.started.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many distinct Functions were started.
    pub(crate) fn len(&self) -> usize {
        self.started().len()
    }

    /// A started runtime for each of `functions`, by name.
    pub(crate) async fn runtimes(&self, functions: &[Function]) -> Result<RuntimeMap, String> {
        let mut map = RuntimeMap::new();
        for function in functions {
            // Function's Debug is every setting that makes its server.
            let key = format!("{function:?}");
            let cell = Arc::clone(self.started().entry(key).or_default());
            let started = cell
                .get_or_init(|| async {
                    let runtime = runtime_for(function, self.runner.as_ref(), &self.defaults)
                        .map_err(|e| crate::chain::Chain(&e).to_string())?;
                    runtime
                        .start()
                        .await
                        .map_err(|e| crate::chain::Chain(&e).to_string())?;
                    Ok(runtime)
                })
                .await;
            match started {
                Ok(runtime) => {
                    map.insert(function.name.clone(), Arc::clone(runtime));
                }
                Err(message) => return Err(format!("Function {:?}: {message}", function.name)),
            }
        }
        Ok(map)
    }

    /// Stops every server started.
    pub(crate) async fn stop(&self) {
        let cells: Vec<Arc<OnceCell<Started>>> = self.started().values().cloned().collect();
        let runtimes: Vec<Arc<dyn Runtime>> = cells
            .iter()
            .filter_map(|c| c.get().and_then(|s| s.as_ref().ok()).cloned())
            .collect();
        futures::future::join_all(runtimes.iter().map(|r| r.stop())).await;
    }
}
