export { Warden, type WardenOptions, type Routine } from "./warden.js";
export { Lock, ReadWriteLock, type AcquireOptions } from "./lock.js";
export {
  Permit,
  Semaphore,
  type SemaphoreAcquireOptions,
  type SemaphoreInfo,
} from "./semaphore.js";
export {
  Cache,
  jsonSerializer,
  type Cached,
  type CacheOptions,
  type LoadOptions,
  type Serializer,
  type WrapOptions,
} from "./cache.js";
export {
  CacheWaitTimeoutError,
  ConnectionError,
  LockBusyError,
  LockLostError,
  ReplyError,
  SemaphoreLimitError,
  WardenError,
} from "./errors.js";
export type { Client } from "./transport.js";
