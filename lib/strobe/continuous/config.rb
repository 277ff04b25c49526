# frozen_string_literal: true

require "socket"
require_relative "../http_client"
require_relative "../options"
require_relative "../redact"
require_relative "../version"

module Strobe
  class Continuous
    # The settings of Strobe::Continuous.start, checked: each problem raises
    # ArgumentError naming its option, before anything starts.
    class Config
      KEYS = %i[url service_name labels mode interval upload_every overhead_target basic_auth bearer_token
                tenant_id ca_file timeout flush_timeout spy_name err].freeze
      MODES = %i[cpu wall object].freeze
      # 100 Hz, as Go's runtime profiler and Pyroscope's agents sample: the
      # governor starts here and never samples faster.
      DEFAULT_INTERVAL = { cpu: 10_000, wall: 10_000, object: 1000 }.freeze
      DEFAULT_UPLOAD_EVERY = 15
      DEFAULT_OVERHEAD_TARGET = 0.01
      DEFAULT_TIMEOUT = 10
      DEFAULT_FLUSH_TIMEOUT = 5
      # What Pyroscope's name parser accepts (grafana/pyroscope,
      # api/model/labelset): an application name of these characters, label
      # names that also suit Prometheus, and values without the characters
      # that end a value (",", "}"; no escaping exists) or could confuse a
      # reader of the series.
      SERVICE_NAME = %r{\A[A-Za-z0-9_.\-/]+\z}
      LABEL_NAME = /\A[a-zA-Z_][a-zA-Z0-9_.]*\z/
      LABEL_VALUE = /\A[^{},="\\[:cntrl:]]{0,1024}\z/
      # Labels Strobe sets itself (on the window, and per sample), and
      # Pyroscope's own.
      OWN_LABELS = %w[service_name hostname pid ruby_version strobe_version sample_rate thread thread_id state
                      endpoint pyroscope_spy].freeze
      # Pyroscope takes at most 30 labels per series: its own 4, Strobe's 5
      # others and 3 per sample leave 18; some are kept spare.
      MAX_LABELS = 16
      # The longest a window or a wait may be (seconds): Pyroscope refuses a
      # profile that began over an hour ago.
      MAX_SECONDS = 3600

      # The interval of mode: the one given, checked as Strobe.start
      # checks it, or DEFAULT_INTERVAL's.
      def self.interval_for(mode, interval)
        interval.nil? ? DEFAULT_INTERVAL.fetch(mode) : Options.new(mode: mode, interval: interval).interval
      end

      attr_reader :url, :service_name, :labels, :mode, :interval, :upload_every, :overhead_target, :headers,
                  :ca_file, :timeout, :flush_timeout, :spy_name, :err

      def initialize(opts)
        Options.check_known(opts, KEYS)

        @url = parse_url(opts[:url])
        @service_name = parse_service(opts.fetch(:service_name) { raise ArgumentError, "service_name: is required" })

        @labels = parse_labels(opts.fetch(:labels, {}))
        @mode = parse_mode(opts.fetch(:mode, :cpu))
        @interval = parse_interval(opts[:interval])
        @upload_every = seconds(:upload_every, opts.fetch(:upload_every, DEFAULT_UPLOAD_EVERY), min: 1, max: 600)
        @overhead_target = parse_target(opts.fetch(:overhead_target, DEFAULT_OVERHEAD_TARGET))
        @headers = auth_headers(opts[:basic_auth], opts[:bearer_token], opts[:tenant_id], @url_authorization)
        @ca_file = opts[:ca_file]&.to_s
        raise ArgumentError, "ca_file #{@ca_file.inspect} is not a readable file" if @ca_file && !File.readable?(@ca_file)

        @timeout = seconds(:timeout, opts.fetch(:timeout, DEFAULT_TIMEOUT))
        @flush_timeout = seconds(:flush_timeout, opts.fetch(:flush_timeout, DEFAULT_FLUSH_TIMEOUT))
        # (Pyroscope rewrites the function names of a "rbspy" profile.)
        @spy_name = opts.fetch(:spy_name, "strobe").to_s
        @err = opts.fetch(:err, $stderr)
      end

      # Without the url's user and password, the query, and the headers
      # (which hold them, or a token).
      def inspect
        Redact.inspect(self, url: Redact.url(@url), service_name: @service_name, mode: @mode)
      end

      # The labels every window carries (Pyroscope series labels), the
      # process's own first: a forked child has its own pid.
      def series_labels(sample_rate)
        { "service_name" => @service_name, "hostname" => hostname, "pid" => Process.pid.to_s,
          "ruby_version" => RUBY_VERSION, "strobe_version" => VERSION, "sample_rate" => sample_rate.to_s }
          .merge(@labels)
      end

      private

      def hostname
        Socket.gethostname.to_s.delete("{},=\"\\")
      rescue StandardError
        "unknown"
      end

      # The URL as a URI without its user and password: those become the
      # Authorization header (@url_authorization) unless basic_auth: or
      # bearer_token: give one, and no message shows them.
      def parse_url(url)
        raise ArgumentError, "url: is required (the Pyroscope server, e.g. http://pyroscope:4040)" if url.nil?

        uri = URI.parse(url.to_s)
        unless uri.is_a?(URI::HTTP) && !uri.host.to_s.empty?
          raise ArgumentError, "url must be an http:// or https:// URL of the Pyroscope server, got " \
                               "#{Redact.url(url).inspect}"
        end

        @url_authorization = HTTPClient.basic_authorization(uri) if uri.user
        uri.user = nil # (and the password)
        uri
      rescue URI::InvalidURIError => e
        raise ArgumentError, "url #{Redact.url(url).inspect} is not a valid URL (#{Redact.uri_error(e)})"
      end

      def parse_service(value)
        value = value.to_s if value.is_a?(Symbol)
        return value if value.is_a?(String) && value.match?(SERVICE_NAME)

        raise ArgumentError, "service_name must be letters, digits and _ . - / (what Pyroscope takes), got #{value.inspect}"
      end

      def label_value(name, value)
        value = value.to_s if value.is_a?(Symbol) || value.is_a?(Numeric)
        raise ArgumentError, "#{name} must be a String, got #{value.inspect}" unless value.is_a?(String)
        unless value.valid_encoding? && value.match?(LABEL_VALUE)
          shown = value.length > 40 ? "#{value[0, 40].inspect}..." : value.inspect
          raise ArgumentError, "#{name} #{shown} must be at most 1024 characters, none of { } , = \" \\ " \
                               "or a control character (what Pyroscope's label syntax carries)"
        end

        value
      end

      def parse_labels(labels)
        raise ArgumentError, "labels must be a Hash, got #{labels.inspect}" unless labels.is_a?(Hash)

        raise ArgumentError, "at most #{MAX_LABELS} labels (Pyroscope takes 30 per series), got #{labels.size}" if labels.size > MAX_LABELS

        labels.to_h do |name, value|
          name = name.to_s
          raise ArgumentError, "label name #{name.inspect} must match #{LABEL_NAME.source}" unless name.match?(LABEL_NAME)
          raise ArgumentError, "label #{name} is Strobe's own: it sets it itself" if OWN_LABELS.include?(name)
          raise ArgumentError, "label names starting with __ are Pyroscope's own, got #{name}" if name.start_with?("__")

          [name, label_value("label #{name}", value)]
        end
      end

      def parse_mode(mode)
        Options.mode_in(mode, MODES, "for continuous profiling")
      end

      def parse_interval(interval)
        Config.interval_for(@mode, interval)
      end

      def seconds(name, value, min: 0, max: MAX_SECONDS)
        if value.is_a?(Numeric) && value.real? && value.finite? && value.positive? && value.between?(min, max)
          return value
        end

        raise ArgumentError, "#{name} must be a number of seconds#{" from #{min}" if min.positive?} up to #{max}, " \
                             "got #{value.inspect}"
      end

      def parse_target(value)
        return nil if value.nil? || value == false
        return value if value.is_a?(Numeric) && value.real? && value.positive? && value < 1

        raise ArgumentError, "overhead_target must be a fraction of one CPU above 0 and below 1 (0.01 is 1 %), " \
                             "or false, got #{value.inspect}"
      end

      def auth_headers(basic, bearer, tenant, from_url)
        headers = {}
        headers["Authorization"] = from_url if from_url
        if basic
          unless basic.is_a?(Array) && basic.size == 2 && basic.all?(String)
            raise ArgumentError, "basic_auth must be [user, password], got #{basic.class}"
          end
          raise ArgumentError, "give basic_auth: or bearer_token:, not both" if bearer

          headers["Authorization"] = "Basic #{[basic.join(':')].pack('m0')}"
        end
        headers["Authorization"] = "Bearer #{header_value(:bearer_token, bearer)}" if bearer
        headers["X-Scope-OrgID"] = header_value(:tenant_id, tenant) if tenant
        headers
      end

      def header_value(name, value)
        return value if value.is_a?(String) && !value.empty? && value.match?(/\A[[:print:]]+\z/) && !value.match?(/[\r\n]/)

        raise ArgumentError, "#{name} must be a non-empty String of printable characters"
      end
    end
  end
end
