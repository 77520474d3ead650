-- Takes the writer's lease for this instance, if it is free or already its own, and
-- answers the log's version (what the instance must have applied before it writes).
-- Otherwise it leaves word that this instance wants it, and answers how long it has left.
-- KEYS: marker, version, lease, want
-- ARGV: holder, lease ms
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'WIPED'}
end
local holder = redis.call('GET', KEYS[3])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
  if redis.call('GET', KEYS[4]) == ARGV[1] then
    redis.call('DEL', KEYS[4])
  end
  return {'OK', redis.call('GET', KEYS[2]) or '0'}
end
redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[2])
return {'HELD', tostring(redis.call('PTTL', KEYS[3]))}
