CREATE FUNCTION pglimit_key_part(b bytea) RETURNS bytea LANGUAGE sql IMMUTABLE RETURN int8send(octet_length(b)::bigint) || b;
CREATE FUNCTION pglimit_hmac(inner_pad bytea, outer_pad bytea, message bytea) RETURNS bytea LANGUAGE sql IMMUTABLE RETURN sha256(outer_pad || sha256(inner_pad || message));
CREATE FUNCTION pglimit_policy_key(inner_pad bytea, outer_pad bytea, policy text, bucket text, algorithm text, vals text[]) RETURNS bytea LANGUAGE sql IMMUTABLE
RETURN pglimit_hmac(inner_pad, outer_pad, pglimit_key_part('policy'::bytea) || pglimit_key_part(convert_to(policy,'UTF8')) || pglimit_key_part(convert_to(bucket,'UTF8')) || pglimit_key_part(convert_to(algorithm,'UTF8')) || coalesce((SELECT string_agg(pglimit_key_part(convert_to(v,'UTF8')), ''::bytea ORDER BY o) FROM unnest(vals) WITH ORDINALITY u(v,o)), ''::bytea));
CREATE FUNCTION pglimit_adhoc_key(inner_pad bytea, outer_pad bytea, key text, algorithm text) RETURNS bytea LANGUAGE sql IMMUTABLE
RETURN pglimit_hmac(inner_pad, outer_pad, pglimit_key_part('adhoc'::bytea) || pglimit_key_part(convert_to(key,'UTF8')) || pglimit_key_part(convert_to(algorithm,'UTF8')));
CREATE FUNCTION pglimit_override_value_key(inner_pad bytea, outer_pad bytea, policy text, identifier text, value text) RETURNS bytea LANGUAGE sql IMMUTABLE
RETURN pglimit_hmac(inner_pad, outer_pad, pglimit_key_part('override'::bytea) || pglimit_key_part(convert_to(policy,'UTF8')) || pglimit_key_part(convert_to(identifier,'UTF8')) || pglimit_key_part(convert_to(value,'UTF8')));
CREATE FUNCTION pglimit_normalise(kind text, name text, raw text) RETURNS text LANGUAGE sql IMMUTABLE RETURN lower(btrim(raw));
CREATE FUNCTION pglimit_ip_in(value text, network text) RETURNS boolean LANGUAGE sql IMMUTABLE RETURN value::inet <<= network::inet;
CREATE FUNCTION pglimit_email_at(value text, domain text) RETURNS boolean LANGUAGE sql IMMUTABLE RETURN split_part(value, '@', 2) = domain;
