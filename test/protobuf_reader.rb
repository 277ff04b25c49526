# frozen_string_literal: true

# A minimal protobuf wire-format reader for the tests: enough of
# profile.proto to check what Strobe's own encoder wrote, independently of
# it. Messages decode to { field_number => [values] }, where a value is an
# Integer (varint) or a binary String (length-delimited: a nested message, a
# string or a packed repeated field; the schema below says which).
module ProtobufReader
  module_function

  def fields(bytes)
    out = Hash.new { |h, k| h[k] = [] }
    pos = 0
    while pos < bytes.bytesize
      key, pos = varint(bytes, pos)
      field = key >> 3
      case key & 7
      when 0
        value, pos = varint(bytes, pos)
      when 2
        len, pos = varint(bytes, pos)
        raise ArgumentError, "field #{field} runs past the end" if pos + len > bytes.bytesize

        value = bytes.byteslice(pos, len)
        pos += len
      else
        raise ArgumentError, "unexpected wire type #{key & 7} for field #{field}"
      end
      out[field] << value
    end
    out
  end

  def varint(bytes, pos)
    value = 0
    shift = 0
    loop do
      byte = bytes.getbyte(pos) or raise ArgumentError, "truncated varint"
      pos += 1
      value |= (byte & 0x7f) << shift
      return [value, pos] if byte < 0x80

      shift += 7
    end
  end

  def packed(bytes)
    values = []
    pos = 0
    while pos < bytes.bytesize
      v, pos = varint(bytes, pos)
      values << v
    end
    values
  end

  # profile.proto, decoded into plain Hashes with the strings resolved.
  def profile(bytes)
    top = fields(bytes)
    strings = top[6].map { |s| s.dup.force_encoding(Encoding::UTF_8) }
    str = ->(i) { strings.fetch(i) }
    value_type = ->(m) { f = fields(m); [str.(f[1].first || 0), str.(f[2].first || 0)] }
    {
      strings: strings,
      sample_types: top[1].map(&value_type),
      samples: top[2].map do |m|
        f = fields(m)
        { locations: f[1].flat_map { |p| packed(p) }, values: f[2].flat_map { |p| packed(p) },
          labels: f[3].map { |l| lf = fields(l); [str.(lf[1].first || 0), lf[2].first ? str.(lf[2].first) : lf[3].first] } }
      end,
      locations: top[4].to_h do |m|
        f = fields(m)
        lines = f[4].map { |l| lf = fields(l); [lf[1].first, lf[2].first || 0] }
        [f[1].first, lines]
      end,
      functions: top[5].to_h do |m|
        f = fields(m)
        [f[1].first, { name: str.(f[2].first || 0), file: str.(f[4].first || 0), start_line: f[5].first || 0 }]
      end,
      time_nanos: top[9].first || 0,
      duration_nanos: top[10].first || 0,
      period_type: top[11].first && value_type.(top[11].first),
      period: top[12].first || 0,
      comments: top[13].map(&str),
      default_sample_type: str.(top[14].first || 0),
    }
  end
end
