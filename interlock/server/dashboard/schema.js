// A small JSON Schema check, run in the page before a decision is sent: the keywords
// the server's patch and data schemas use most (type, properties, required,
// additionalProperties, min/maxProperties, enum, const, items, min/maxItems,
// min/maxLength, minimum/maximum). Any other keyword is left to the server, which
// checks every decision in full when it arrives (and its refusal is shown).

function typeOf(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number";
  return typeof value; // string, boolean, object
}

function fits(value, type) {
  const t = typeOf(value);
  return t === type || (type === "number" && t === "integer");
}

const show = (v) => {
  const text = JSON.stringify(v);
  return text.length > 40 ? `${text.slice(0, 37)}...` : text;
};

/** The problems of ``value`` against ``schema``, as "at $.path: what" strings. */
export function problems(schema, value, path = "$") {
  const out = [];
  if (schema === true || schema === undefined || schema === null) return out;
  if (schema === false) return [`at ${path}: nothing is allowed here`];
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => fits(value, t))) {
      out.push(`at ${path}: ${show(value)} is ${typeOf(value)}, expected ${types.join(" or ")}`);
      return out;
    }
  }
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(value))) {
    out.push(`at ${path}: ${show(value)} is not one of ${schema.enum.map(show).join(", ")}`);
  }
  if ("const" in schema && JSON.stringify(schema.const) !== JSON.stringify(value)) {
    out.push(`at ${path}: expected ${show(schema.const)}`);
  }
  const t = typeOf(value);
  if (t === "object") {
    const keys = Object.keys(value);
    if (schema.minProperties !== undefined && keys.length < schema.minProperties) {
      out.push(`at ${path}: at least ${schema.minProperties} field(s) needed, got ${keys.length}`);
    }
    if (schema.maxProperties !== undefined && keys.length > schema.maxProperties) {
      out.push(`at ${path}: at most ${schema.maxProperties} field(s) allowed, got ${keys.length}`);
    }
    for (const name of schema.required || []) {
      if (!(name in value)) out.push(`at ${path}: '${name}' is required`);
    }
    const props = schema.properties || {};
    for (const key of keys) {
      if (key in props) out.push(...problems(props[key], value[key], `${path}.${key}`));
      else if (schema.additionalProperties === false) {
        const known = Object.keys(props);
        out.push(`at ${path}: '${key}' is not a field this accepts` +
          (known.length ? ` (known: ${known.join(", ")})` : ""));
      } else if (typeof schema.additionalProperties === "object") {
        out.push(...problems(schema.additionalProperties, value[key], `${path}.${key}`));
      }
    }
  } else if (t === "array") {
    if (schema.minItems !== undefined && value.length < schema.minItems) out.push(`at ${path}: at least ${schema.minItems} item(s) needed`);
    if (schema.maxItems !== undefined && value.length > schema.maxItems) out.push(`at ${path}: at most ${schema.maxItems} item(s) allowed`);
    if (schema.items && typeof schema.items === "object") {
      value.forEach((item, i) => out.push(...problems(schema.items, item, `${path}[${i}]`)));
    }
  } else if (t === "string") {
    if (schema.minLength !== undefined && value.length < schema.minLength) out.push(`at ${path}: at least ${schema.minLength} character(s) needed`);
    if (schema.maxLength !== undefined && value.length > schema.maxLength) out.push(`at ${path}: at most ${schema.maxLength} character(s) allowed`);
  } else if (t === "number" || t === "integer") {
    if (schema.minimum !== undefined && value < schema.minimum) out.push(`at ${path}: ${value} is less than ${schema.minimum}`);
    if (schema.maximum !== undefined && value > schema.maximum) out.push(`at ${path}: ${value} is more than ${schema.maximum}`);
  }
  return out;
}

/** ``text`` parsed as JSON, with its problems against ``schema``: {value, problems}. */
export function checkJson(text, schema, what) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return { value: undefined, problems: [`${what} is not valid JSON: ${error.message}`] };
  }
  return { value, problems: problems(schema, value) };
}
