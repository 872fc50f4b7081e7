//! How the command line spells the library's enums (`--image-pull-policy`,
//! `--network-policy`, `--rootfs`, `--warm-pool-start`, `--network`,
//! `--ready-when`): the library's types carry no CLI derive, so the CLI
//! maps them here, once, reusing a type's own spelling where it has one
//! (`as_str`).
use clap::builder::PossibleValue;

use crate::grpc::listen::Network;
use crate::host::status::ReadyWhen;
use crate::image::PullPolicy;
use crate::rootfs::RootfsMode;
use crate::runner::{NetworkPolicy, WarmStart};

/// `impl clap::ValueEnum for $type`: each variant with its spelling, the
/// help `--help` shows for it, and its aliases.
macro_rules! value_enum {
    ($type:ty { $($variant:expr => $name:expr, $help:literal $(, alias $alias:literal)?;)* }) => {
        impl clap::ValueEnum for $type {
            fn value_variants<'a>() -> &'a [Self] {
                &[$($variant),*]
            }

            fn to_possible_value(&self) -> Option<PossibleValue> {
                $(
                    if *self == $variant {
                        return Some(PossibleValue::new($name).help($help)$(.alias($alias))?);
                    }
                )*
                None
            }
        }
    };
}

value_enum!(PullPolicy {
    PullPolicy::IfNotPresent => PullPolicy::IfNotPresent.as_str(),
        "Pull only when not cached (also the protocol's UNSPECIFIED)", alias "if-not-present";
    PullPolicy::Always => PullPolicy::Always.as_str(),
        "Re-resolve the reference every time; cached layers are reused", alias "always";
    PullPolicy::Never => PullPolicy::Never.as_str(),
        "Never contact the registry: the image must be cached", alias "never";
});

value_enum!(NetworkPolicy {
    NetworkPolicy::Isolated => NetworkPolicy::Isolated.as_str(),
        "An own, empty network namespace (also the protocol's UNSPECIFIED)";
    NetworkPolicy::Runner => NetworkPolicy::Runner.as_str(),
        "The runner's network; /etc/resolv.conf bound read-only";
});

value_enum!(RootfsMode {
    RootfsMode::Auto => "auto", "Overlay where the probe at start says it works, else copy";
    RootfsMode::Overlay => "overlay", "Always overlay; an error where overlay cannot be mounted";
    RootfsMode::Copy => "copy", "Always a per-run copy of the flattened rootfs";
});

value_enum!(WarmStart {
    WarmStart::Started => "started",
        "Started: the function's process runs, blocked reading its stdin, so a call pays only \
         for the function's own work on its input (what it does at start, an interpreter's \
         start included, is done before)";
    WarmStart::Created => "created",
        "Created only: the process waits before it execs the function, which starts when its \
         call arrives (for functions that must not start before their input)";
});

value_enum!(ReadyWhen {
    ReadyWhen::All => "all", "Once every hosted function's package is ready";
    ReadyWhen::Any => "any", "Once any is (or none is hosted)";
});

value_enum!(Network {
    Network::Unix => "unix", "A Unix socket (`@name` for an abstract one)";
    Network::Tcp => "tcp", "TCP: no caller checks; for tests and benchmarks";
});

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn the_command_line_takes_kubernetes_spelling_and_lowercase() {
        for (text, policy) in [
            ("IfNotPresent", PullPolicy::IfNotPresent),
            ("if-not-present", PullPolicy::IfNotPresent),
            ("Always", PullPolicy::Always),
            ("never", PullPolicy::Never),
        ] {
            assert_eq!(PullPolicy::from_str(text, false), Ok(policy));
        }
    }

    #[test]
    fn every_variant_has_its_one_spelling_and_it_reads_back() {
        fn reads_back<T: ValueEnum + PartialEq + std::fmt::Debug>() {
            for variant in T::value_variants() {
                let name = variant.to_possible_value().unwrap();
                assert_eq!(T::from_str(name.get_name(), false).as_ref(), Ok(variant));
            }
        }
        reads_back::<PullPolicy>();
        reads_back::<NetworkPolicy>();
        reads_back::<RootfsMode>();
        reads_back::<WarmStart>();
        reads_back::<Network>();
        reads_back::<ReadyWhen>();
        assert_eq!(
            NetworkPolicy::Runner
                .to_possible_value()
                .unwrap()
                .get_name(),
            "Runner"
        );
        assert_eq!(
            RootfsMode::Copy.to_possible_value().unwrap().get_name(),
            "copy"
        );
    }
}
