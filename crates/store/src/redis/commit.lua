-- Appends one round of journal records to the ledger's log, if this instance still holds
-- the writer's lease and the log ends where the round starts (a fenced append: whoever
-- lost the lease, or missed a round, writes nothing).
-- KEYS: marker, version, log, lease, want
-- ARGV: holder, expected version, the round's last sequence number, lease ms, frames
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'WIPED'}
end
if redis.call('GET', KEYS[4]) ~= ARGV[1] then
  return {'LEASE'}
end
local version = redis.call('GET', KEYS[2])
if version ~= ARGV[2] then
  return {'STALE', version or '0'}
end
redis.call('XADD', KEYS[3], ARGV[3] .. '-0', 'r', ARGV[5])
redis.call('SET', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[4], ARGV[4])
return {'OK', redis.call('EXISTS', KEYS[5])}
