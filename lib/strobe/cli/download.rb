# frozen_string_literal: true

# Downloading a profile for `strobe report URL`: http:// only, into a
# temporary file, bounded in time and memory whatever the server does (the
# wire is HTTPClient's).

require "uri"
require_relative "../http_client"
require_relative "../profile_file"

module Strobe
  class CLI
    # A profile that could not be downloaded; its message says why.
    class DownloadError < StandardError; end

    # A profile at an http:// URL, such as the strobe.json link `strobe serve`
    # prints:
    #
    #   Download.new(url).open { |path| ... }   # raises DownloadError
    #
    # One GET by HTTPClient (Net::HTTP reads header lines into a buffer
    # without a bound and retries a GET that timed out): one deadline for
    # the whole download, connecting included; a cap on the status line and
    # headers (interim 1xx responses count towards it); the body, by
    # Content-Length, chunked or up to the end of the connection, capped and
    # written to the file as it comes.
    class Download
      # What is taken for a URL (https:// too, to refuse it in words).
      URL = %r{\Ahttps?://}i
      # The most a body may be (the most the profile loader inflates a file
      # to) and its status line and headers.
      LIMIT = ProfileFile::MAX_INFLATED
      HEAD_LIMIT = HTTPClient::HEAD_LIMIT
      # The longest line giving a chunk's size (with extensions).
      CHUNK_LINE_LIMIT = HTTPClient::CHUNK_LINE_LIMIT
      # Seconds the whole download may take.
      DEADLINE = 60
      ENCODINGS = ["", "identity", "gzip", "x-gzip"].freeze

      class << self
        # Seconds the whole download may take: DEADLINE unless set (a test
        # sets it lower).
        attr_writer :deadline

        def deadline
          @deadline || DEADLINE
        end

        def url?(path)
          path.match?(URL)
        end
      end

      def initialize(url)
        @url = url
      end

      # Downloads the URL into a temporary file and yields its path; the file
      # is removed after. Gzip is asked for and kept as it came: the loader's
      # checks of gzipped files apply to it.
      def open
        require "tempfile"
        uri = begin
          URI.parse(@url)
        rescue URI::InvalidURIError => e
          raise DownloadError, "not a valid URL (#{Redact.uri_error(e)})" # (its message quotes the URL)
        end
        raise DownloadError, "only http:// URLs can be downloaded" if uri.is_a?(URI::HTTPS) || !uri.is_a?(URI::HTTP)
        raise DownloadError, "the URL names no host" if uri.host.to_s.empty?

        Tempfile.create("strobe-download") do |file|
          file.binmode
          fetch(uri, file)
          file.flush
          yield file.path
        end
      end

      private

      # The profile into file: the status, encoding and size checked before
      # its body is read. The request is what it always was: Host with the
      # port, no authentication from the URL.
      def fetch(uri, file)
        seconds = self.class.deadline
        client = HTTPClient.new(deadline: seconds, head_limit: HEAD_LIMIT, chunk_line_limit: CHUNK_LINE_LIMIT)
        url = URI::HTTP.build(host: uri.host, port: uri.port, path: uri.path, query: uri.query)
        headers = { "Host" => "#{uri.host}:#{uri.port}", "Accept-Encoding" => "gzip" }
        client.request(url, headers: headers, body_limit: LIMIT) do |response|
          check(response)
          response.read_body { |chunk| file.write(chunk) }
          raise DownloadError, too_large if response.truncated?
        end
      rescue HTTPClient::Timeout # (once connected: "no connection within N s" is an Error as it is)
        raise DownloadError, "the server did not send the whole profile within #{seconds} s"
      rescue HTTPClient::Error => e
        raise DownloadError, e.message
      rescue SystemCallError => e
        raise DownloadError, HTTPClient.system_reason(e)
      rescue IOError => e
        raise DownloadError, e.message
      end

      # Raises unless the response is a 200 whose body is gzip or plain and
      # not larger than LIMIT by its Content-Length.
      def check(response)
        raise DownloadError, "HTTP #{response.code} #{response.reason}".strip unless response.code == 200

        encoding = response["content-encoding"].to_s.strip.downcase
        raise DownloadError, "the server sent it in #{encoding}, not gzip" unless ENCODINGS.include?(encoding)
        raise DownloadError, too_large if response.content_length.to_i > LIMIT
      end

      def too_large
        "larger than #{LIMIT >> 20} MB, the most a profile may be"
      end
    end
  end
end
