//! Command registration and dispatch without copying arguments: a handler
//! sees the server's own argument strings as `&[Arg]`, runs inside the panic
//! guard, and its result becomes the reply.

use std::ffi::CString;
use std::ops::Deref;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{raw, Context, RedisError, RedisResult, RedisString};

use crate::error;

/// One argument of the running command: the server's string, borrowed.
#[repr(transparent)]
pub struct Arg(*mut raw::RedisModuleString);

impl Arg {
    pub fn raw(&self) -> *mut raw::RedisModuleString {
        self.0
    }

    /// Borrows a string the module created (a key name kept in a queue).
    pub fn of(s: &RedisString) -> &Arg {
        // Safety: `Arg` is a transparent wrapper of the pointer `RedisString` holds first.
        unsafe { &*std::ptr::addr_of!(s.inner).cast::<Arg>() }
    }
}

impl Deref for Arg {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        let mut len = 0;
        let ptr = raw::string_ptr_len(self.0, &mut len);
        // Safety: the server keeps the string alive for the whole command.
        unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
    }
}

pub type Handler = fn(&Context, &[Arg]) -> RedisResult;

/// A command of the registration table.
pub struct Command {
    pub name: &'static str,
    pub flags: &'static str,
    /// Whether its first argument is its one key (else it takes no key).
    pub keyed: bool,
    pub run:
        extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int,
}

/// Runs `handler` on the command's arguments; a panic becomes `ERR internal error`.
pub fn dispatch(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: Handler,
) -> c_int {
    let context = Context::new(ctx);
    let args: &[Arg] = if argv.is_null() {
        &[]
    } else {
        // Safety: `Arg` is `repr(transparent)` over the pointers Redis hands us.
        unsafe { std::slice::from_raw_parts(argv.cast::<Arg>(), argc as usize) }
    };
    let result = catch_unwind(AssertUnwindSafe(|| handler(&context, args)))
        .unwrap_or(Err(RedisError::Str(error::INTERNAL)));
    context.reply(result) as c_int
}

/// Declares a command: its name, handler and flags. A command has one key,
/// its first argument, unless declared `keyless`.
#[macro_export]
macro_rules! command {
    ($name:literal, $handler:path, $flags:literal, keyless) => {{
        $crate::command::Command {
            keyed: false,
            ..$crate::command!($name, $handler, $flags)
        }
    }};
    ($name:literal, $handler:path, $flags:literal) => {{
        extern "C" fn run(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            $crate::command::dispatch(ctx, argv, argc, $handler)
        }
        $crate::command::Command {
            name: $name,
            flags: $flags,
            keyed: true,
            run,
        }
    }};
}

/// Registers every command of the table: first key 1, last key 1, step 1,
/// or no key.
pub fn register(ctx: &Context, commands: &[Command]) -> bool {
    commands.iter().all(|c| {
        let (Ok(name), Ok(flags)) = (CString::new(c.name), CString::new(c.flags)) else {
            return false;
        };
        let status = unsafe {
            raw::RedisModule_CreateCommand.unwrap()(
                ctx.ctx,
                name.as_ptr(),
                Some(c.run),
                flags.as_ptr(),
                c_int::from(c.keyed),
                c_int::from(c.keyed),
                c_int::from(c.keyed),
            )
        };
        status == raw::REDISMODULE_OK as c_int
    })
}
