//! Internal macros.

/// True when `$node` runs with mutation `$m`; constant `false` without the feature, so that the
/// broken branch is not even compiled into normal builds.
macro_rules! mutated {
    ($node:expr, $m:ident) => {{
        #[cfg(feature = "mutations")]
        let on = $node.mutation == Some(crate::mutation::Mutation::$m);
        #[cfg(not(feature = "mutations"))]
        let on = false;
        on
    }};
}
