# frozen_string_literal: true

require "json"
require "uri"
require_relative "../http_client"
require_relative "../redact"

module Strobe
  class Continuous
    # Grafana Pyroscope's ingest API, as its server parses a request
    # (grafana/pyroscope, pkg/ingester/pyroscope/ingest_handler.go):
    #
    #   POST /ingest?name=SERVICE.TYPE{k=v,...}&from=S&until=S&format=pprof
    #        &sampleRate=HZ&spyName=strobe
    #   body: the window's profile, gzipped pprof (profile.proto)
    #
    # format=pprof makes the body the profile as it is (no multipart form).
    # The series is named by the pprof's sample types (cpu: process_cpu,
    # wall, objects: memory), its service_name by the label of that name,
    # which is sent too; the per-sample string labels (thread, endpoint)
    # become series labels. Auth is Basic or Bearer, and X-Scope-OrgID names
    # the tenant of a multi-tenant server.
    class Pyroscope
      TYPES = { cpu: "cpu", wall: "wall", object: "objects" }.freeze
      # The answer of a server that took the profile (its 2xx), and those
      # worth sending the same window again for: it may pass.
      RETRY = [408, 429, 500, 502, 503, 504].freeze
      # What is read of an answer, for its message.
      BODY_LIMIT = 4096
      # Refusals of the credentials: only their status and its reason
      # phrase are told (a server or a proxy may quote the header it got).
      REFUSED = { 401 => "Unauthorized", 403 => "Forbidden" }.freeze

      # What an upload came to.
      Outcome = Struct.new(:ok, :retry, :message)

      def initialize(config)
        @config = config
        @client = HTTPClient.new(deadline: config.timeout, ca_file: config.ca_file)
        @base = config.url.dup
        @base.path = "#{config.url.path.chomp('/')}/ingest"
        @base.query = nil
        @secrets = Redact.authorization_forms(config.headers["Authorization"])
      end

      # (Without the credentials it hides.)
      def inspect = Redact.inspect(self, config: @config)

      # The URL of one upload: the window from..till (Time), with its
      # labels, at sample_rate (samples per second, or per allocation).
      def url(from, till, sample_rate)
        labels = @config.series_labels(sample_rate).map { |k, v| "#{k}=#{v}" }.join(",")
        params = { name: "#{@config.service_name}.#{TYPES.fetch(@config.mode)}{#{labels}}", from: from.to_i,
                   until: till.to_i, format: "pprof", sampleRate: sample_rate, spyName: @config.spy_name }
        # (The server reads sampleRate as an integer, and logs anything else:
        # allocations have none. For pprof it takes the period instead.)
        params.delete(:sampleRate) unless sample_rate.is_a?(Integer)
        query = URI.encode_www_form(params)
        uri = @base.dup
        uri.query = query
        uri.to_s
      end

      # Sends a window's gzipped pprof; an Outcome, never an exception. A
      # 2xx status is success whatever follows it (the store has the
      # window: sending it again would count it twice).
      def upload(body, from, till, sample_rate)
        headers = { "Content-Type" => "application/octet-stream" }.merge(@config.headers)
        @client.request(url(from, till, sample_rate), method: "POST", headers: headers, body: body,
                                                       body_limit: BODY_LIMIT) do |response|
          next Outcome.new(true, false, nil) if response.code.between?(200, 299)

          said = REFUSED.fetch(response.code) { answer_of(response) }
          Outcome.new(false, RETRY.include?(response.code), "HTTP #{response.code} #{said}".strip)
        end
      rescue HTTPClient::Error => e
        Outcome.new(false, true, Redact.secrets(e.message, @secrets))
      end

      private

      # What the server said (Pyroscope answers errors as JSON with a
      # message), in one line of printable characters, any credentials it
      # quotes as ***.
      def answer_of(response)
        text = begin
          response.read_body.to_s
        rescue HTTPClient::Error
          ""
        end
        text = text.dup.force_encoding(Encoding::UTF_8).scrub.gsub(/[[:cntrl:]]/, " ")
        # (Every JSON string in it decoded, under any key: an encoder may
        # write a token's "/" as "\/" or its "&" as "\u0026".)
        message = json_string(text[/"message"\s*:\s*(#{JSON_STRING})/o, 1]) ||
                  text.gsub(/#{JSON_STRING}/o) { |literal| (decoded = json_string(literal)) ? "\"#{decoded}\"" : literal }
        message = Redact.secrets(message.gsub(/\s+/, " ").strip, @secrets)
        message = "#{message[0, 200]}..." if message.length > 200
        message.empty? ? Redact.secrets(response.reason.to_s.gsub(/[[:cntrl:]]/, " "), @secrets) : message
      end

      JSON_STRING = /"(?:[^"\\]|\\.)*"/

      # A JSON string literal's text, every escape decoded (\u0026 too, as
      # Go's encoder writes & < >), printable; nil for none or a bad one.
      def json_string(literal)
        return nil if literal.nil?

        JSON.parse("[#{literal}]").first.to_s.gsub(/[[:cntrl:]]/, " ")
      rescue JSON::ParserError
        nil
      end
    end
  end
end
