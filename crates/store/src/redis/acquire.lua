-- Takes the writer's lease for this instance, if it is its own already, or free and no
-- other instance is waiting for it (turns go in order of asking), and answers the log's
-- version (what the instance must have applied before it writes) and Redis's clock (the
-- ledger's time, one for every instance: seconds, microseconds). Otherwise it leaves word
-- that this instance wants it, unless another already has, and answers how long the
-- holder has left (-2: nobody holds it, another instance's turn is next) and whether the
-- word is this instance's (1: it is next, and the holder wakes it through `turn` when it
-- gives the lease up).
-- KEYS: marker, version, lease, want, turn
-- ARGV: holder, lease ms, how long the word lasts unless renewed (ms)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'WIPED'}
end
local holder = redis.call('GET', KEYS[3])
local waiting = redis.call('GET', KEYS[4])
local free = holder == false and (waiting == false or waiting == ARGV[1])
if free or holder == ARGV[1] then
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
  if waiting == ARGV[1] then
    redis.call('DEL', KEYS[4], KEYS[5])
  end
  local time = redis.call('TIME')
  return {'OK', redis.call('GET', KEYS[2]) or '0', time[1], time[2]}
end
local next = 0
if waiting == false or waiting == ARGV[1] then
  redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[3])
  next = 1
end
return {'HELD', tostring(redis.call('PTTL', KEYS[3])), next}
