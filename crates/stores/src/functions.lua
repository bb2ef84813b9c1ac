#!lua name=stateplane_replication
-- The replicated guarantee's store side, as Redis functions: each call is atomic and
-- reads the server's clock, and each follows `StoreCore::handle` (crates/replication/
-- src/store.rs) line for line. A flow's record is a hash:
--   v       its state (absent: never written)
--   seq     the last write applied (decimal, 0 when absent)
--   wepoch  the epoch of the lease it was applied under (0 when absent)
--   epoch   the last grant's fencing epoch
--   holder  who holds the lease ("switch:incarnation")
--   until   when the lease ends, microseconds on the server's clock
--   dies    when v times out, microseconds on the server's clock (absent: never); a
--           grant from then on finds no state, the epoch and seq kept
-- A flow's alias (crates/replication/src/protocol.rs) is a string record of its own, in
-- the flow's slot (they share a hash tag): the flow's key (its tag's length, then its
-- bytes), set by a write applied that names it, and expiring with the flow's record (each
-- write and renewal naming it sets its expiry to the record's).
-- Every call keeps the record at least `retain_ms` after it, and until its state times out
-- if that is later (flows long gone are dropped; a retention far longer than any lease
-- keeps a record while it can matter).
-- Answers are arrays whose first element says which: G (granted), H (held by another),
-- W (written), R (renewed), F (fenced), S (an alias resolved).
-- The functions' names carry VERSION (as `VERSION` in crates/stores/src/redis.rs): a
-- switch of another version, whose calls and answers differ, finds none of its own and is
-- told so at its next call, rather than calling these with arguments they misread.
-- `stateplane_version`, under the same name in every version, says which is loaded.

local VERSION = 2

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Whether decimal a is greater than decimal b (both without leading zeros): sequence
-- numbers are 64-bit, beyond what a Lua number holds exactly.
local function greater(a, b)
  if #a ~= #b then
    return #a > #b
  end
  return a > b
end

local function lease_of(asked, min, max)
  return math.min(math.max(tonumber(asked), tonumber(min)), tonumber(max))
end

local function record(key)
  local r = redis.call('HMGET', key, 'v', 'seq', 'epoch', 'holder', 'until', 'dies', 'wepoch')
  return {
    value = r[1],
    seq = r[2] or '0',
    epoch = r[3] or '0',
    holder = r[4],
    until_us = tonumber(r[5]) or 0,
    dies_us = tonumber(r[6]),
    written_epoch = r[7] or '0',
  }
end

-- The state lives `keep_us` from `now` (negative: until written again), and the record at
-- least as long.
local function keep(key, now, keep_us, retain_ms)
  local k = tonumber(keep_us)
  if k < 0 then
    redis.call('HDEL', key, 'dies')
    return
  end
  redis.call('HSET', key, 'dies', string.format('%d', now + k))
  local keep_ms = math.ceil(k / 1000)
  if keep_ms > tonumber(retain_ms) then
    redis.call('PEXPIRE', key, keep_ms)
  end
end

-- The lease runs `lease` microseconds from `now` (with any other fields given set in the
-- same call), and the record is kept `retain_ms` more at least (never less than it was:
-- its state may live longer).
local function extend(key, now, lease, retain_ms, ...)
  redis.call('HSET', key, 'until', string.format('%d', now + lease), ...)
  if redis.call('PTTL', key) < tonumber(retain_ms) then
    redis.call('PEXPIRE', key, retain_ms)
  end
end

-- The alias record `alias` (if any) names the flow `flow` (if given) and expires with the
-- flow's record `key`.
local function follow(key, alias, flow)
  if not alias then
    return
  end
  if flow then
    redis.call('SET', alias, flow)
  end
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then
    redis.call('PEXPIRE', alias, ttl)
  else
    redis.call('PERSIST', alias)
  end
end

-- A refusal, or nil if `holder` holds the lease of `epoch` and it runs now.
local function fenced(r, holder, epoch, now)
  if r.holder == holder and r.epoch == epoch and now < r.until_us then
    return nil
  end
  return {'F', epoch}
end

-- ARGV: holder, lease_us, nonce, min_lease_us, max_lease_us, retain_ms
-- (`now`: the batch's clock reading, read here when called alone.)
local function acquire(keys, args, now)
  local key, holder, nonce = keys[1], args[1], args[3]
  local lease = lease_of(args[2], args[4], args[5])
  now = now or now_us()
  local r = record(key)
  local runs = now < r.until_us
  local epoch = r.epoch
  if r.holder and runs and r.holder ~= holder then
    return {'H', string.format('%d', r.until_us - now), nonce}
  end
  if r.holder == holder and runs then
    extend(key, now, lease, args[6])
  else
    epoch = string.format('%d', tonumber(r.epoch) + 1)
    extend(key, now, lease, args[6], 'epoch', epoch, 'holder', holder)
  end
  if r.value and r.dies_us and now >= r.dies_us then
    redis.call('HDEL', key, 'v', 'dies')
    r.value = nil
  end
  if r.value then
    return {'G', epoch, r.seq, string.format('%d', lease), nonce, 1, r.value, r.written_epoch}
  end
  return {'G', epoch, r.seq, string.format('%d', lease), nonce, 0, '', r.written_epoch}
end

-- KEYS: the record, and its alias's record if `flow` (the flow's key, to be found by the
-- alias) is not empty.
-- ARGV: holder, epoch, seq, value, lease_us, keep_us, flow, min_lease_us, max_lease_us,
-- retain_ms
local function write(keys, args, now)
  local key, holder, epoch, seq = keys[1], args[1], args[2], args[3]
  now = now or now_us()
  local r = record(key)
  local refused = fenced(r, holder, epoch, now)
  if refused then
    return refused
  end
  local lease = lease_of(args[5], args[8], args[9])
  if greater(seq, r.seq) then
    extend(key, now, lease, args[10], 'v', args[4], 'seq', seq, 'wepoch', epoch)
    keep(key, now, args[6], args[10])
    if args[7] ~= '' then
      follow(key, keys[2], args[7])
    end
  else
    extend(key, now, lease, args[10])
  end
  return {'W', epoch, seq, string.format('%d', lease)}
end

-- KEYS: the record, and its alias's record if `alias` is 1.
-- ARGV: holder, epoch, lease_us, nonce, keep_us, alias, min_lease_us, max_lease_us,
-- retain_ms
local function renew(keys, args, now)
  local key, holder, epoch, nonce = keys[1], args[1], args[2], args[4]
  now = now or now_us()
  local r = record(key)
  local refused = fenced(r, holder, epoch, now)
  if refused then
    return refused
  end
  local lease = lease_of(args[3], args[7], args[8])
  extend(key, now, lease, args[9])
  keep(key, now, args[5], args[9])
  if args[6] == '1' then
    follow(key, keys[2], nil)
  end
  return {'R', epoch, string.format('%d', lease), nonce}
end

-- KEYS: an alias's record. ARGV: nonce.
local function resolve(keys, args)
  local flow = redis.call('GET', keys[1])
  if flow then
    return {'S', args[1], 1, flow}
  end
  return {'S', args[1], 0, ''}
end

-- Many calls of one holder in one (group commit: one call carries many flows' writes).
-- KEYS: a record per call, and after it its alias's record for a W whose flow argument
-- is not empty and an R whose alias argument is 1. ARGV: holder, min_lease_us,
-- max_lease_us, retain_ms, then per call its kind and its own arguments, in the single
-- functions' order:
--   A lease_us nonce  |  W epoch seq value lease_us keep_us flow
--   R epoch lease_us nonce keep_us alias  |  S nonce
-- The answer: the calls' answers, in order.
local function batch(keys, args)
  local holder, min, max, retain = args[1], args[2], args[3], args[4]
  local out = {}
  local i, k = 5, 1
  -- One clock reading for the whole call: it is atomic, so no time passes within it.
  local now = now_us()
  while i <= #args do
    local kind = args[i]
    local key = {keys[k]}
    if kind == 'A' then
      out[#out + 1] = acquire(key, {holder, args[i + 1], args[i + 2], min, max, retain}, now)
      i = i + 3
    elseif kind == 'W' then
      if args[i + 6] ~= '' then
        k = k + 1
        key[2] = keys[k]
      end
      out[#out + 1] = write(key, {holder, args[i + 1], args[i + 2], args[i + 3], args[i + 4], args[i + 5], args[i + 6], min, max, retain}, now)
      i = i + 7
    elseif kind == 'R' then
      if args[i + 5] == '1' then
        k = k + 1
        key[2] = keys[k]
      end
      out[#out + 1] = renew(key, {holder, args[i + 1], args[i + 2], args[i + 3], args[i + 4], args[i + 5], min, max, retain}, now)
      i = i + 6
    elseif kind == 'S' then
      out[#out + 1] = resolve(key, {args[i + 1]})
      i = i + 2
    else
      return redis.error_reply('stateplane_batch: call ' .. #out + 1 .. ' is of no kind known')
    end
    k = k + 1
  end
  if k ~= #keys + 1 then
    return redis.error_reply('stateplane_batch: ' .. #keys .. ' keys for calls that name ' .. k - 1)
  end
  return out
end

local prefix = 'stateplane_v' .. VERSION .. '_'
redis.register_function(prefix .. 'batch', batch)
redis.register_function(prefix .. 'acquire', acquire)
redis.register_function(prefix .. 'write', write)
redis.register_function(prefix .. 'renew', renew)
redis.register_function(prefix .. 'resolve', resolve)
redis.register_function{
  function_name = 'stateplane_version',
  callback = function() return VERSION end,
  flags = {'no-writes'},
}
