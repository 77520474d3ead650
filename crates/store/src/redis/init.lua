-- Finds the ledger's marker, or, for an instance that may create the ledger, marks a new
-- one. A log without its marker is a Redis that lost keys (an eviction, a partial
-- restore): refused, never served.
-- KEYS: marker, version, log
-- ARGV: the new ledger's marker, 'create' or 'find'
local marker = redis.call('GET', KEYS[1])
if marker then
  return {'OK', marker}
end
if redis.call('EXISTS', KEYS[2]) == 1 or redis.call('EXISTS', KEYS[3]) == 1 then
  return {'DAMAGED'}
end
if ARGV[2] ~= 'create' then
  return {'WIPED'}
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], '0')
return {'NEW', ARGV[1]}
