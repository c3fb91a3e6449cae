//! The command line: each module turns one subcommand's arguments into its library's typed
//! configuration and prints the results for people. No library crate depends on clap; flags,
//! their help and the text tables live here (as ripgrep keeps its flags in its binary).

pub mod disc;
pub mod disksim;
pub mod lab;
pub mod load;
pub mod micro;
pub mod seed;
pub mod serve;
pub mod stats;
pub mod tiers;
pub mod tracker;

/// A flag's value enum for an enum a library owns: declares the CLI's own `clap::ValueEnum`
/// with the variants' help (what `--help` lists) and converts both ways with exhaustive
/// matches, so a variant added on either side without the other is a compile error.
///
/// ```ignore
/// choice_enum! {
///     #[value(rename_all = "kebab-case")]
///     pub enum Model => iolab_servers::Model { Threads, ThreadPool }
/// }
/// ```
macro_rules! choice_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident => $lib:ty {
            $( $(#[$vmeta:meta])* $variant:ident ),+ $(,)?
        }
    ) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
        $(#[$meta])*
        pub enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl From<$name> for $lib {
            fn from(v: $name) -> Self {
                type Lib = $lib;
                match v {
                    $( $name::$variant => Lib::$variant ),+
                }
            }
        }

        impl From<$lib> for $name {
            fn from(v: $lib) -> Self {
                type Lib = $lib;
                match v {
                    $( Lib::$variant => $name::$variant ),+
                }
            }
        }
    };
}
pub(crate) use choice_enum;

/// A number of seconds for a flag: fractions allowed, 0 to 1e9.
pub fn parse_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(0.0..=1e9).contains(&v) {
        return Err(format!("{s} is out of range (0 to 1e9 seconds)"));
    }
    Ok(v)
}
