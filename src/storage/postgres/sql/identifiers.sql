-- Bucket keys derived in SQL, so that a caller can check a limit inside its
-- own transaction: the identifier normalisation of
-- src/policy/identifier.rs, the override patterns of
-- src/policy/overrides/matching.rs and src/policy/cidr.rs, and the HMAC of
-- src/limiter/key.rs, which tests/api/sql_identifiers.rs holds equal.
--
-- SQL has no Unicode case folding, NFKD nor UTS #46 (IDNA), so it refuses
-- with 0A000 (feature_not_supported) a text_folded or email value that is
-- not ASCII once trimmed, and an email whose domain has a punycode label
-- (`xn--`): it never returns a value that Rust would not. Every other
-- refusal is Rust's, with 22023 and Rust's message. The plpgsql functions
-- find the others through the search path, as those of batch.sql do.

-- Char::is_whitespace (Unicode's White_Space), what Rust's trim removes:
-- built by chr() when called, so that a database not in UTF8 can still
-- install this file.
CREATE FUNCTION pglimit_white_space() RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT string_agg(chr(c), '' ORDER BY c)
        FROM unnest(ARRAY[9, 10, 11, 12, 13, 32, 133, 160, 5760, 8192, 8193, 8194, 8195, 8196, 8197, 8198,
                          8199, 8200, 8201, 8202, 8232, 8233, 8239, 8287, 12288]) AS c);

-- A bracket expression of the ASCII characters but NUL, with `extra`.
CREATE FUNCTION pglimit_ascii_class(negated boolean, first int, last int, extra text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '[' || CASE WHEN negated THEN '^' ELSE '' END || chr(first) || '-' || chr(last) || extra || ']';

-- ASCII lowercase (Rust's to_ascii_lowercase); lower() follows the collation.
CREATE FUNCTION pglimit_ascii_lower(t text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN translate(t, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz');

-- A dotted quad as Rust's Ipv4Addr parser takes it (no leading zeros).
CREATE FUNCTION pglimit_ipv4_syntax() RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])([.](25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])){3}';

-- The 4 bytes of an IPv4 address written as Rust's parser takes it, else NULL.
CREATE FUNCTION pglimit_ipv4(t text) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN CASE WHEN t ~ ('^' || pglimit_ipv4_syntax() || '$') THEN
    decode(lpad(to_hex(split_part(t, '.', 1)::int), 2, '0') || lpad(to_hex(split_part(t, '.', 2)::int), 2, '0')
        || lpad(to_hex(split_part(t, '.', 3)::int), 2, '0') || lpad(to_hex(split_part(t, '.', 4)::int), 2, '0'),
        'hex')
END;

-- The 16-bit groups of one side of an IPv6 `::`, 4 hex digits each, an
-- embedded IPv4 tail (`with_v4`) as two; NULL if malformed, '' if empty.
CREATE FUNCTION pglimit_ipv6_groups(t text, with_v4 boolean) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (
    SELECT CASE
        WHEN t = '' THEN ''
        WHEN t ~ '^([0-9A-Fa-f]{1,4}:)*[0-9A-Fa-f]{1,4}$' THEN hex
        WHEN with_v4 AND t ~ ('^([0-9A-Fa-f]{1,4}:)*' || pglimit_ipv4_syntax() || '$') THEN
            hex || encode(pglimit_ipv4(substring(t FROM '[^:]*$')), 'hex')
    END
    FROM (SELECT coalesce(string_agg(lpad(g, 4, '0'), '' ORDER BY o), '') AS hex
          FROM regexp_split_to_table(t, ':') WITH ORDINALITY AS s(g, o)
          WHERE g <> '' AND g !~ '[.]') AS h
);

-- The 16 bytes of an IPv6 address written as Rust's Ipv6Addr parser takes
-- it (no zone, no prefix, an IPv4 tail only last), else NULL.
CREATE FUNCTION pglimit_ipv6(t text) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (
    SELECT decode(CASE
        WHEN NOT double THEN CASE WHEN octet_length(whole) = 32 THEN whole END
        WHEN position('::' IN tail) = 0 AND octet_length(head) + octet_length(rest) <= 28
            THEN head || repeat('0', 32 - octet_length(head) - octet_length(rest)) || rest
    END, 'hex')
    FROM (SELECT position('::' IN t) > 0 AS double, split_part(t, '::', 1) AS head_text,
                 substr(t, position('::' IN t) + 2) AS tail) AS s,
         LATERAL (SELECT CASE WHEN NOT double THEN pglimit_ipv6_groups(t, true) END AS whole,
                         pglimit_ipv6_groups(head_text, false) AS head,
                         pglimit_ipv6_groups(tail, true) AS rest) AS g
);

-- The bits of `b`, as '0' and '1'.
CREATE FUNCTION pglimit_bits(b bytea) RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (('x' || encode(b, 'hex'))::varbit)::text;

-- How Rust writes an IPv6 address's /64 (RFC 5952: its low 64 bits are
-- zero, so the longest run of zero groups is always the trailing one).
CREATE FUNCTION pglimit_ipv6_group_text(b bytea) RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (
    SELECT coalesce(string_agg(to_hex(get_byte(b, 2 * i) * 256 + get_byte(b, 2 * i + 1)), ':' ORDER BY i)
               FILTER (WHERE i <= last), '') || '::/64'
    FROM generate_series(0, 3) AS i,
         LATERAL (SELECT max(j) AS last FROM generate_series(0, 3) AS j
                  WHERE get_byte(b, 2 * j) <> 0 OR get_byte(b, 2 * j + 1) <> 0) AS l
);

-- `name` as Rust's {:?} writes it, for names without control characters
-- (Debug's escapes of a backslash and a quote).
CREATE FUNCTION pglimit_quoted(name text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '"' || replace(replace(name, chr(92), chr(92) || chr(92)), '"', chr(92) || '"') || '"';

-- Raises Rust's Invalid::BadIdentifier, `identifier {name:?} {reason}`.
-- This and the other raising functions are volatile so that the planner
-- never runs them early, folding a CASE branch that is not taken.
CREATE FUNCTION pglimit_bad_identifier(name text, reason text) RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'identifiers.' || name,
        MESSAGE = format('identifier %s %s', pglimit_quoted(name), reason);
END $$;

-- Raises what SQL cannot normalise as Rust does, and where to check it.
CREATE FUNCTION pglimit_unsupported(name text, what text) RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '0A000', COLUMN = 'identifiers.' || name, MESSAGE = format(
        'identifier %s: pglimit''s SQL functions normalise only %s; check this one through POST /check',
        pglimit_quoted(name), what);
END $$;

CREATE FUNCTION pglimit_normalise_ip(name text, v text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    b bytea := pglimit_ipv6(v);
BEGIN
    IF pglimit_ipv4(v) IS NOT NULL THEN
        RETURN v; -- no leading zeros: already as Ipv4Addr writes it
    ELSIF b IS NULL THEN
        RETURN pglimit_bad_identifier(name, 'is not an IPv4 or IPv6 address');
    ELSIF substring(b FOR 12) = '\x00000000000000000000ffff'::bytea THEN
        RETURN format('%s.%s.%s.%s', get_byte(b, 12), get_byte(b, 13), get_byte(b, 14), get_byte(b, 15));
    END IF;
    RETURN pglimit_ipv6_group_text(b);
END $$;

-- The ASCII path of Rust's normalise_email, given a trimmed ASCII value.
CREATE FUNCTION pglimit_normalise_email(name text, v text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    folded text := pglimit_ascii_lower(v);
    domain text := substring(folded FROM '@([^@]*)$');
    local text := split_part(substring(folded FOR length(folded) - length(domain) - 1), '+', 1);
    bad text := pglimit_ascii_class(false, 1, 32, chr(127) || '@'); -- whitespace, controls, '@'
BEGIN
    IF domain IS NULL OR local = '' OR local ~ bad THEN
        RETURN pglimit_bad_identifier(name, 'is not an email address (expected local@domain)');
    ELSIF position('.xn--' IN '.' || domain) > 0 THEN
        RETURN pglimit_unsupported(name, 'email addresses whose domain has no punycode (xn--) label');
    ELSIF domain = '' OR domain ~ bad OR domain LIKE '.%' OR domain LIKE '%.' OR domain LIKE '%..%' THEN
        RETURN pglimit_bad_identifier(name, 'is not an email address (expected local@domain)');
    END IF;
    RETURN local || '@' || domain;
END $$;

-- IdentifierKind::normalise: the value of identifier `name` of `kind`
-- (email, ip, text, text_folded) as Rust normalises it, or Rust's refusal;
-- 0A000 where SQL cannot tell (see the top of this file); NULL for NULL.
CREATE FUNCTION pglimit_normalise(kind text, name text, raw text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    v text := btrim(raw, pglimit_white_space());
BEGIN
    IF getdatabaseencoding() <> 'UTF8' THEN
        RAISE EXCEPTION USING ERRCODE = '0A000', MESSAGE = 'pglimit''s SQL functions need a UTF8 database';
    ELSIF octet_length(raw) > 512 THEN
        RETURN pglimit_bad_identifier(name, 'is longer than 512 bytes');
    ELSIF v = '' THEN
        RETURN pglimit_bad_identifier(name, 'is empty');
    ELSIF kind = 'text' THEN
        RETURN v;
    ELSIF kind = 'ip' THEN
        RETURN pglimit_normalise_ip(name, v);
    ELSIF kind NOT IN ('email', 'text_folded') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('no identifier kind named %L', kind);
    ELSIF v ~ pglimit_ascii_class(true, 1, 127, '') THEN
        RETURN pglimit_unsupported(name, format('ASCII values of kind %s', kind));
    ELSIF kind = 'email' THEN
        RETURN pglimit_normalise_email(name, v);
    END IF;
    RETURN pglimit_ascii_lower(v);
END $$;

-- One part of a key: its length as 8 bytes big-endian, then its bytes.
CREATE FUNCTION pglimit_key_part(b bytea) RETURNS bytea LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN int8send(octet_length(b)::bigint) || b;

-- STABLE as convert_to is, so that the planner inlines it (and the keys
-- below): a SQL function it cannot inline is planned at every call.
CREATE FUNCTION pglimit_text_part(t text) RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE
RETURN pglimit_key_part(convert_to(t, 'UTF8'));

-- HMAC-SHA256 from KeySecret::pads (64 bytes each, else NULL), so that the
-- secret itself never reaches the database.
CREATE FUNCTION pglimit_hmac(inner_pad bytea, outer_pad bytea, message bytea) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN octet_length(inner_pad) = 64 AND octet_length(outer_pad) = 64 THEN
    sha256(outer_pad || sha256(inner_pad || message))
END;

-- bucket_key's KeyScope::Policy; NULL if a value is NULL. In plpgsql,
-- whose plans are kept: a SQL function with a subquery is planned anew at
-- every call (a tenth of a millisecond, most of a check's time).
CREATE FUNCTION pglimit_policy_key(inner_pad bytea, outer_pad bytea, policy text, bucket text, algorithm text,
                                   vals text[]) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE message bytea := pglimit_text_part('policy') || pglimit_text_part(policy) || pglimit_text_part(bucket)
                         || pglimit_text_part(algorithm);
        v text;
BEGIN
    FOREACH v IN ARRAY vals LOOP
        IF v IS NULL THEN
            RETURN NULL;
        END IF;
        message := message || pglimit_text_part(v);
    END LOOP;
    RETURN pglimit_hmac(inner_pad, outer_pad, message);
END
$$;

-- bucket_key's KeyScope::AdHoc.
CREATE FUNCTION pglimit_adhoc_key(inner_pad bytea, outer_pad bytea, key text, algorithm text) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE
RETURN pglimit_hmac(inner_pad, outer_pad,
    pglimit_text_part('adhoc') || pglimit_text_part(key) || pglimit_text_part(algorithm));

-- bucket_key's KeyScope::OverrideValue.
CREATE FUNCTION pglimit_override_value_key(inner_pad bytea, outer_pad bytea, policy text, identifier text,
                                           value text) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE
RETURN pglimit_hmac(inner_pad, outer_pad,
    pglimit_text_part('override') || pglimit_text_part(policy) || pglimit_text_part(identifier)
    || pglimit_text_part(value));

-- Pattern::EmailDomain's match: the normalised email `value` is a mailbox
-- at exactly `domain` (as the pattern holds it, lowercase).
CREATE FUNCTION pglimit_email_at(value text, domain text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN coalesce(substring(value FROM '@([^@]*)$') = domain COLLATE "C", false);

-- Raises Cidr::parse's refusal of a network.
CREATE FUNCTION pglimit_bad_cidr(reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = reason;
END $$;

-- Cidr::contains: whether the normalised ip `value` (an IPv4 address, or an
-- IPv6 /64 written `x::/64`) lies in `network`, read as Cidr::parse reads
-- it (and refused as it refuses it); across families, false.
CREATE FUNCTION pglimit_ip_in(value text, network text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    address text := split_part(network, '/', 1);
    digits text := substr(network, length(address) + 2);
    v4 bytea := pglimit_ipv4(address);
    net bytea := coalesce(v4, pglimit_ipv6(address));
    prefix int := CASE WHEN digits ~ '^[0-9]{1,3}$' THEN digits::int END;
    ip bytea := CASE WHEN v4 IS NOT NULL THEN pglimit_ipv4(value)
                     WHEN value LIKE '%/64' THEN pglimit_ipv6(substring(value FOR length(value) - 3)) END;
BEGIN
    IF position('/' IN network) = 0 THEN
        RETURN pglimit_bad_cidr('not a CIDR: expected address/prefix, e.g. 10.0.0.0/8');
    ELSIF net IS NULL THEN
        RETURN pglimit_bad_cidr('not a CIDR: the part before ''/'' is not an IPv4 or IPv6 address');
    ELSIF prefix IS NULL THEN
        RETURN pglimit_bad_cidr('not a CIDR: the prefix after ''/'' must be a whole number');
    ELSIF v4 IS NOT NULL AND prefix > 32 THEN
        RETURN pglimit_bad_cidr('not a CIDR: an IPv4 prefix is at most 32');
    ELSIF v4 IS NULL AND prefix > 128 THEN
        RETURN pglimit_bad_cidr('not a CIDR: an IPv6 prefix is at most 128');
    ELSIF v4 IS NULL AND prefix > 64 THEN
        RETURN pglimit_bad_cidr('the CIDR is longer than /64: IPv6 values are grouped by their /64 before '
            'matching, so a longer prefix cannot be decided; use /64 or less');
    ELSIF position('1' IN substr(pglimit_bits(net), prefix + 1)) > 0 THEN
        RETURN pglimit_bad_cidr(format('the CIDR has bits set after its /%s: write the network''s first '
            'address (10.0.0.0/8, not 10.1.2.3/8)', prefix));
    END IF;
    RETURN coalesce(substr(pglimit_bits(ip), 1, prefix) = substr(pglimit_bits(net), 1, prefix), false);
END $$;
