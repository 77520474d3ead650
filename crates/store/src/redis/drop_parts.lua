-- Deletes some of a snapshot's parts, if this instance still holds the compactor's lock: a
-- compactor whose lock lapsed must not delete the parts another one is writing.
-- KEYS: compactor's lock, then the parts
-- ARGV: holder
-- Answers how many parts it deleted, or -1 without the lock.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local deleted = 0
for i = 2, #KEYS do
  deleted = deleted + redis.call('UNLINK', KEYS[i])
end
return deleted
