//! Per-thread state for the executor and the reactor, declared with
//! [`local!`]. Hosted targets may have threads, so each has its own
//! executor (a `thread_local!`); bare metal has one CPU and one thread of
//! control, so a plain static does.

/// Declares `static $name`, a `RefCell<$ty>` reached with `with`, as
/// `thread_local!`'s statics are.
#[cfg(not(target_os = "none"))]
macro_rules! local {
    ($(#[$m:meta])* static $name:ident: $ty:ty = $init:expr;) => {
        ::std::thread_local! {
            $(#[$m])* static $name: ::core::cell::RefCell<$ty> =
                const { ::core::cell::RefCell::new($init) };
        }
    };
}

/// Declares `static $name`, a `RefCell<$ty>` reached with `with`, as
/// `thread_local!`'s statics are.
#[cfg(target_os = "none")]
macro_rules! local {
    ($(#[$m:meta])* static $name:ident: $ty:ty = $init:expr;) => {
        $(#[$m])* static $name: $crate::asynch::local::Local<$ty> =
            $crate::asynch::local::Local(::core::cell::RefCell::new($init));
    };
}
pub(crate) use local;

/// A static cell with `thread_local!`'s `with`, for bare metal.
#[cfg(target_os = "none")]
pub(crate) struct Local<T>(pub(crate) core::cell::RefCell<T>);

// SAFETY: one CPU, and interrupt handlers touch none of this state.
#[cfg(target_os = "none")]
unsafe impl<T> Sync for Local<T> {}

#[cfg(target_os = "none")]
impl<T> Local<T> {
    pub(crate) fn with<R>(&'static self, f: impl FnOnce(&core::cell::RefCell<T>) -> R) -> R {
        f(&self.0)
    }
}
