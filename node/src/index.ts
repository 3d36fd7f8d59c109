export { Warden, type WardenOptions, type Routine } from "./warden.js";
export { Lock, ReadWriteLock, type AcquireOptions } from "./lock.js";
export {
  Permit,
  Semaphore,
  type SemaphoreAcquireOptions,
  type SemaphoreInfo,
} from "./semaphore.js";
export {
  RateLimiter,
  type Rate,
  type RateAcquireOptions,
  type RateDecision,
  type RateInfo,
  type RateLimiterOptions,
} from "./rate.js";
export {
  Cache,
  jsonSerializer,
  type Cached,
  type CacheOptions,
  type LoadOptions,
  type Serializer,
  type WrapOptions,
} from "./cache.js";
export { NearCache, type NearCacheOptions, type NearCacheStats } from "./near.js";
export {
  CacheWaitTimeoutError,
  ConnectionError,
  LockBusyError,
  LockLostError,
  RateMismatchError,
  ReplyError,
  SemaphoreLimitError,
  WardenError,
  type StatedRate,
} from "./errors.js";
export type { Client } from "./transport.js";
