-- Points the ledger at a new snapshot, if the ledger is still this one, this instance still
-- holds the compactor's lock, the snapshot is newer than the current one and the log holds
-- every record it covers. The compactor trims the log's records it holds after, in steps.
-- KEYS: marker, version, snapshot, log, pending snapshots, compactor's lock
-- ARGV: marker, holder, name, version, parts, time (ms), bytes
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 'WIPED'
end
if redis.call('GET', KEYS[6]) ~= ARGV[2] then
  return 'LOCK'
end
local version = tonumber(ARGV[4])
if tonumber(redis.call('HGET', KEYS[3], 'version') or '0') >= version then
  return 'STALE'
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < version then
  return 'BEHIND'
end
-- The replaced snapshot's parts are deleted by the compactor once this returns.
local old = redis.call('HGET', KEYS[3], 'name')
if old then
  redis.call('SADD', KEYS[5], old)
end
redis.call('SREM', KEYS[5], ARGV[3])
redis.call('HSET', KEYS[3], 'name', ARGV[3], 'version', ARGV[4], 'parts', ARGV[5],
  'at', ARGV[6], 'bytes', ARGV[7])
return 'OK'
