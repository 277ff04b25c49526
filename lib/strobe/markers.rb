# frozen_string_literal: true

module Strobe
  # The marker timeline beside the samples (result[:markers]): an Array of
  # Hashes in order of start,
  #
  #   { type: :gc, name: "GC", thread: 4242, start: 1200, end: 1450, data: {...} }
  #
  # type a Symbol (:gc, :request, :user, ...), name a String, thread the id
  # of a thread in result[:threads] (nil: none), start and end times on the
  # clock of raw_sample_timestamps (CLOCK_MONOTONIC microseconds; end nil for
  # an instant), data a Hash of Symbol keys to Strings, numbers, true, false
  # or nil (or nil). Markers are kept for threads while they are sampled.
  # A result's markers are in order of start; a merge puts each result's
  # after the previous one's (as it does raw samples).
  module Markers
    TYPE = /\A[a-z_][a-z0-9_.]{0,63}\z/

    module_function

    # Strobe.mark: see there.
    def mark(type, name, data)
      unless block_given?
        add(type, name, Native.now_us, nil, data)
        return nil
      end

      start = Native.now_us
      begin
        yield
      ensure
        add(type, name, start, Native.now_us, data)
      end
    end

    # A marker on the calling thread (kept if it is sampled now), its name
    # and data made plain. Returns whether it was kept.
    def add(type, name, start, finish, data)
      Native.marker_add(type_of(type), utf8(name.to_s), start, finish, plain_data(data))
    end

    # type as a marker type a profile file keeps (TYPE): downcased, other
    # characters as "_", at most 64 ("Billing.charge" :"billing.charge",
    # "!render_template.action_view" :"_render_template.action_view").
    def type_of(type)
      return type if type.is_a?(Symbol) && type.match?(TYPE)

      name = type.to_s.downcase.gsub(/[^a-z0-9_.]/, "_")
      name = "_#{name}" unless name.match?(/\A[a-z_]/)
      name[0, 64].to_sym
    end

    # data with Symbol keys and values that survive a profile file as they
    # are: UTF-8 Strings, integers below 2**62, finite floats, true, false,
    # nil; others as their to_s. nil for an empty Hash.
    def plain_data(data)
      return nil if data.nil? || data.empty?

      data.to_h do |key, value|
        value = case value
                when true, false, nil then value
                when Integer then value.abs < LIMIT ? value : value.to_s
                when Float then value.finite? ? value : value.to_s
                else utf8(value.to_s)
                end
        [key.to_sym, value]
      end
    end

    LIMIT = 2**62

    # str as valid UTF-8 (a JSON file holds nothing else): binary and
    # US-ASCII bytes taken for UTF-8, other encodings converted, what is not
    # valid replaced.
    def utf8(str)
      return str if str.encoding == Encoding::UTF_8 && str.valid_encoding?

      str = if [Encoding::BINARY, Encoding::US_ASCII, Encoding::UTF_8].include?(str.encoding)
              str.dup.force_encoding(Encoding::UTF_8)
            else
              str.encode(Encoding::UTF_8, invalid: :replace, undef: :replace)
            end
      str.valid_encoding? ? str : str.scrub
    end

    # The file form: a row per marker, [type, name, thread, start, end, data].
    def encode(markers)
      markers.map { |m| [m[:type].to_s, m[:name], m[:thread], m[:start], m[:end], m[:data]] }
    end

    # Back from the file form; ProfileError (naming what, in name) for
    # anything else.
    def decode(rows, name)
      raise ProfileError, "#{name}: markers is not an array" unless rows.is_a?(Array)

      rows.each_with_index.map do |row, i|
        type, label, thread, start, finish, data = row if row.is_a?(Array) && row.size == 6
        unless type.is_a?(String) && type.match?(TYPE) && label.is_a?(String) && (thread.nil? || thread.is_a?(Integer)) &&
               start.is_a?(Integer) && start.between?(0, LIMIT - 1) &&
               (finish.nil? || (finish.is_a?(Integer) && finish.between?(start, LIMIT - 1))) &&
               (data.nil? || (data.is_a?(Hash) && data.each_value.all? { |v| plain?(v) }))
          raise ProfileError, "#{name}: marker #{i} is malformed"
        end

        { type: type.to_sym, name: label, thread: thread, start: start, end: finish, data: data }
      end
    end

    def plain?(value)
      case value
      when String, true, false, nil then true
      when Integer then value.abs < LIMIT
      when Float then value.finite?
      when Array then value.all? { |v| v.is_a?(String) }
      else false
      end
    end
  end
end
