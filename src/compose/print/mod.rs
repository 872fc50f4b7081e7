//! The print stage of a render: [`output`], the YAML stream `crossplane
//! render` prints (in YAML 1.1 where Crossplane's printer differs,
//! [`yaml11`], its long scalars folded at go-yaml's width, [`fold`]), with
//! the metadata [`names`](crate::compose::names) gives composed resources.
mod fold;
mod operation;
pub(crate) mod output;
mod yaml11;
